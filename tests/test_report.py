"""fedagg.results.report on a real two-method, two-seed sweep: the HTML holds the table values and an image per section."""

import csv
from html.parser import HTMLParser

from conftest import compose_config
from fedagg.results import report, table as make_table
from fedagg.run import train


class Sections(HTMLParser):
    """The report's sections: heading, image count, text."""

    def __init__(self):
        super().__init__()
        self.sections, self.in_heading = [], False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "h2":
            self.sections.append({"title": "", "images": 0, "text": ""})
            self.in_heading = True
        elif tag == "img" and self.sections:
            self.sections[-1]["images"] += 1
            assert attrs["src"].startswith("data:image/png;base64,")  # embedded: no file, no network

    def handle_endtag(self, tag):
        if tag == "h2":
            self.in_heading = False

    def handle_data(self, data):
        if self.sections:
            self.sections[-1]["title" if self.in_heading else "text"] += data


def test_report_of_a_two_method_two_seed_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    for i, (agg, seed) in enumerate([("fedavg", 0), ("fedavg", 1), ("ida", 0), ("ida", 1)]):
        train(compose_config("rounds=3", "device=cpu", "eval.per_client=true", f"aggregator={agg}", f"seed={seed}"),
              sweep / str(i), choices={"aggregator": agg, "dataset": "digits"})
    assert report.main([str(sweep), "--wandb-mode", "disabled"]) == 0
    page = (sweep / "report.html").read_text()
    assert "http://" not in page and "https://" not in page and "<script" not in page
    parser = Sections()
    parser.feed(page)
    by_title = {s["title"]: s for s in parser.sections}
    assert list(by_title) == ["What was run", "Table", "Test accuracy per round", "Test accuracy against bits sent",
                              "Per-client accuracy", "Aggregation weights", "Partition", "Paired statistics against fedavg"]
    for title in ("Test accuracy per round", "Test accuracy against bits sent", "Per-client accuracy",
                  "Aggregation weights", "Partition"):
        assert by_title[title]["images"] == 1, title
    assert by_title["Paired statistics against fedavg"]["images"] >= 1
    run_text = by_title["What was run"]["text"]
    assert "variesvaluesseed0, 1methodfedavg, idaMethodaggregatorits settingsFedAvgFedAvgweighting=\"samples\"" in run_text
    assert "config.aggregator" not in run_text.split("settings every run shares")[0]  # hyperparameters are no axis
    assert "The partition of seed 0 (run 0); every run with the same seed" in by_title["Partition"]["text"]
    # the table's values are make_table's, computed from the same runs
    make_table.main([str(sweep)])
    cells = list(csv.DictReader(open(sweep / "table.csv")))
    for cell in cells:
        assert cell["measured_text"] in by_title["Table"]["text"]
    assert "Paired difference to FedAvg" in by_title["Paired statistics against fedavg"]["text"]


def test_shared_settings_are_those_every_run_has_with_one_value():
    flat = [{"config.aggregator._target_": "FedAvg", "config.seed": 0, "config.rounds": 30},
            {"config.aggregator._target_": "FedAWA", "config.aggregator.server_lr": None, "config.seed": 0,
             "config.rounds": 30},
            {"config.aggregator._target_": "FedAWA", "config.aggregator.server_lr": None, "config.seed": 1,
             "config.rounds": 30}]
    # server_lr is null where it exists and absent in the FedAvg run: not shared (and no KeyError)
    assert report.shared_settings(flat) == {"config.rounds": "30"}
    assert report.shared_settings(flat[1:]) == {"config.aggregator._target_": '"FedAWA"',
                                                "config.aggregator.server_lr": "null", "config.rounds": "30"}
    assert report.shared_settings([]) == {}
