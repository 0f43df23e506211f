"""The notebook's figure (step 5), drawn by real matplotlib (Agg, no screen) from crafted results: which bars,
how high, which labels and values; the run cell's lines without a measurement and without matplotlib; a real
kernel shows the figure as an image.  The kit itself never requires matplotlib."""

import json
import sys

import matplotlib
import pytest

import mesure_memoire
from conftest import MESSAGES, ROOT, plain_id

matplotlib.use("Agg")  # before pyplot: no screen, and the same drawing everywhere
from matplotlib import pyplot  # noqa: E402

DATA = ROOT / "tests" / "data" / "report"
NOTEBOOK = ROOT / "mesure-memoire.ipynb"
MEASURED = ("measured peak allocated", "measured peak reserved")


def load(path):
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture
def closes_figures():
    """pyplot keeps every figure it draws: closed after each test."""
    yield
    pyplot.close("all")


def bars_of(axes):
    """{legend label: [(x, height, the value written on the bar)]}, in drawing order."""
    found = {}
    for container, values in zip(axes.containers, _bar_texts(axes), strict=True):
        found[container.get_label()] = [
            (bar.get_x() + bar.get_width() / 2, bar.get_height(), text)
            for bar, text in zip(container.patches, values, strict=True)
        ]
    return found


def _bar_texts(axes):
    """The texts bar_label wrote, grouped per container (bar_label adds one text per bar, in order)."""
    texts = [text.get_text() for text in axes.texts]
    groups, start = [], 0
    for container in axes.containers:
        groups.append(texts[start : start + len(container.patches)])
        start += len(container.patches)
    assert start == len(texts)
    return groups


def mib(value_bytes):
    return value_bytes / 2**20


def tick_labels(axes):
    return [label.get_text() for label in axes.get_xticklabels()]


def test_one_measurement_shows_each_phase_measured_peaks_beside_the_plan(closes_figures):
    result = load(DATA / "bfloat16.json")
    plan = mesure_memoire.memory_plan(result["configuration"])
    (axes,) = mesure_memoire.draw_phases(result).axes
    phases = result["phases"]
    labels = [
        "model_load",
        "inputs",
        "cold_forward",
        "warmup x1",
        "warm_forward #1",
        "warm_forward #2",
        "warm_forward #3",
    ]
    assert tick_labels(axes) == labels  # as the phase table names them
    bars = bars_of(axes)
    assert list(bars) == [*MEASURED, "plan's peak allocated"]
    assert [label.get_text() for label in axes.get_legend().get_texts()] == list(bars)
    for index, (record, planned) in enumerate(zip(phases, plan["phases"], strict=True)):
        values = (
            record["peak_allocated_bytes"],
            record["peak_reserved_bytes"],
            planned["predicted_peak_level_allocated_bytes"],
        )
        for name, value in zip(bars, values, strict=True):
            x, height, text = bars[name][index]
            assert height == pytest.approx(mib(value), rel=1e-12)
            assert text == mesure_memoire.in_units(value, 2**20)
            assert round(x) == index  # each bar in its phase's group
    # The three bars of a group side by side, in the legend's order, the middle one on its phase's label.
    assert [x for x, _, _ in bars[MEASURED[1]]] == pytest.approx(range(len(labels)), abs=1e-12)
    assert bars[MEASURED[0]][0][0] < bars[MEASURED[1]][0][0] < bars["plan's peak allocated"][0][0]
    assert axes.get_ylabel() == "MiB"
    assert axes.get_title().splitlines() == [
        "Peak memory per phase: batch 4, context 256, width 512, bfloat16",
        mesure_memoire.PHASE_FIGURE_NOTE,
    ]


def test_the_figure_is_laid_out_as_drawn(closes_figures):
    figure = mesure_memoire.draw_phases(load(DATA / "bfloat16.json"))
    (axes,) = figure.axes
    assert tuple(figure.get_size_inches()) == (10, 4.5)
    assert type(figure.get_layout_engine()).__name__ == "ConstrainedLayoutEngine"
    assert axes.title.get_fontsize() == 9
    assert {(tick.get_rotation(), tick.get_horizontalalignment()) for tick in axes.get_xticklabels()} == {(30, "right")}
    assert {text.get_fontsize() for text in axes.texts} == {7}  # the values on the bars
    assert {round(bar.get_width(), 12) for container in axes.containers for bar in container} == {round(0.8 / 3, 12)}
    assert {text.get_fontsize() for text in axes.get_legend().get_texts()} == {8}


def test_a_phase_that_disagrees_is_labelled_so():
    result = load(DATA / "bfloat16.json")
    result["phases"][2]["verdict"] = "disagrees"
    labels, _ = mesure_memoire.phase_bar_data(result)
    assert [label.endswith(" DISAGREES") for label in labels] == [index == 2 for index in range(len(labels))]


def figure_cell_namespace(measurement):
    """The notebook's definitions, then ``measurement`` as step 3 leaves it."""
    namespace = {}
    cells = {cell["id"]: "".join(cell["source"]) for cell in load(NOTEBOOK)["cells"] if cell["cell_type"] == "code"}
    for cell_id, source in cells.items():
        if cell_id.startswith(("shared-code-", "step-")):
            exec(compile(source, "<notebook>", "exec"), namespace)
    namespace["measurement"] = measurement
    return namespace, compile(cells["run-figure"], "<notebook>", "exec")


def test_the_figure_cell_says_in_one_line_when_there_is_nothing_to_draw_or_no_matplotlib(monkeypatch, capsys):
    namespace, run_figure = figure_cell_namespace(None)
    exec(run_figure, namespace)
    assert capsys.readouterr().out == MESSAGES["figure: nothing to draw"]
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # matplotlib not installed, as far as import can tell
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    namespace["measurement"] = load(DATA / "bfloat16.json")
    exec(run_figure, namespace)
    assert capsys.readouterr().out == MESSAGES["no figure"].format(why=MESSAGES["matplotlib not importable"]) + "\n"
    assert "figure" not in namespace


@pytest.mark.parametrize(
    ("version", "said"),
    [
        ("not installed", MESSAGES["matplotlib not importable"]),
        ("3.4.3", MESSAGES["matplotlib too old"].format(version="'3.4.3'")),
        (None, MESSAGES["matplotlib too old"].format(version="''")),
        *((version, None) for version in ["3.5.0", "3.10.9", "4.0.0rc1"]),
    ],
    ids=plain_id,
)
def test_without_matplotlib_3_5_or_later_the_kit_refuses_to_draw_in_one_line(version, said, monkeypatch):
    """A stand-in matplotlib module (not installed here) of another version, or none said, or none importable;
    3.5 and later are taken."""
    import types

    stand_in = types.SimpleNamespace(pyplot=pyplot, **({} if version is None else {"__version__": version}))
    monkeypatch.setitem(sys.modules, "matplotlib", None if version == "not installed" else stand_in)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None if version == "not installed" else pyplot)
    if said is None:
        assert mesure_memoire.import_pyplot() is pyplot
        return
    with pytest.raises(mesure_memoire.KitError) as refused:
        mesure_memoire.draw_phases(load(DATA / "bfloat16.json"))
    assert str(refused.value) == said


def test_a_real_kernel_shows_the_figure_as_an_image(executed_notebook):
    """After Run All in a real ipykernel, a crafted measurement in place of step 3's, then the figure cell: it
    draws that measurement (without one it says there is nothing to draw)."""
    folder, cells, _ = executed_notebook
    (shown,) = cells["figure-again"].outputs
    assert shown.output_type == "display_data"
    assert "image/png" in shown.data
    assert sorted(path.name for path in folder.iterdir()) == [NOTEBOOK.name]  # drawing writes no file
