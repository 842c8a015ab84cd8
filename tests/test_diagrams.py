"""The three diagrams (lab.diagrams): drawn with plotly shapes only, every box's text inside its box
(the builder refuses otherwise), titles and legends that fit the report."""
import pytest

from lab import diagrams
from lab.report.readable import problems


@pytest.mark.parametrize("name,words", [("luca", ["adapter", "calibrator", "frozen<br>backbone", "h ⊙ s(h)"]),
                                        ("tosca_inference", ["router", "LuCA of task 0", "LuCA of task 2"]),
                                        ("aware_pipeline", ["profile", "select", "masked fine-tuning", "merge back"])])
def test_each_diagram_is_shapes_and_text_that_fit(name, words):
    fig = getattr(diagrams, name)()
    d = fig.to_dict()
    assert not d["layout"].get("images"), "no image files"
    boxes = [s for s in d["layout"]["shapes"] if s["type"] == "rect"]
    texts = " ".join(a["text"] for a in d["layout"]["annotations"])
    assert len(boxes) >= 5 and all(w in texts for w in words)
    assert not problems(fig) and fig.layout.width == diagrams.WIDTH


def test_a_box_too_small_for_its_text_is_refused():
    with pytest.raises(ValueError, match="wider than its box"):
        diagrams._figure([diagrams._Box(0, 0, 5, 10, "a label far too long for five percent")], [], "t", 200)


def test_the_tosca_diagram_draws_as_many_modules_as_asked():
    texts = [a.text for a in diagrams.tosca_inference(4).layout.annotations]
    assert sum(t.startswith("LuCA of task") for t in texts) == 4
