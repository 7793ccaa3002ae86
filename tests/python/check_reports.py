"""lopper's HTML reports (--report on prune, sensitivity, train and compare) draw in a real browser.

Each report is opened from disk in Debian's headless Chromium (no network, a fresh profile) and its
DOM is read back after the page's scripts ran: every chart (a Chart.js canvas) must have painted
pixels, the page must count as many charts as its sections call for, and no script error may have
been raised. The page's data must be the figures lopper printed in its JSON report. A control
case strips Chart.js from a report and checks that the same probe then sees the failure.

Data: a slice of Fashion-MNIST (2048 training, 512 test images) written as IDX files, so that the
training run stays short. Usage: check_reports.py LOPPER FIXTURES_DIR
"""

import gzip
import html.parser
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

import cases

FASHION = "/usr/share/datasets/fashion-mnist"
HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples")


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("chromium not found: run scripts/install-deps.sh (Debian's chromium)")


def dump_dom(browser, page, tmp):
    """The DOM of `page` after its scripts ran, from headless Chromium with a fresh profile."""
    profile = tempfile.mkdtemp(dir=tmp, prefix="profile-")
    r = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
         "--window-size=1280,2000", f"--user-data-dir={profile}", "--dump-dom",
         "file://" + os.path.abspath(page)],
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "<body" in r.stdout, f"chromium failed: {r.stderr[-2000:]}"
    return r.stdout


class Probe(html.parser.HTMLParser):
    """What the page left in its DOM: the body's counters, each canvas's painted pixels, the error
    box's text."""

    def __init__(self):
        super().__init__()
        self.body = {}
        self.painted = []
        self.errors = ""
        self._in_errors = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        elif tag == "canvas":
            self.painted.append(int(a.get("data-painted", "0")))
        self._in_errors = a.get("id") == "errors"

    def handle_data(self, data):
        if self._in_errors:
            self.errors += data

    def handle_endtag(self, tag):
        self._in_errors = False


def probe(browser, page, tmp):
    p = Probe()
    p.feed(dump_dom(browser, page, tmp))
    return p


def page_data(page):
    """The JSON the page draws."""
    text = open(page, encoding="utf-8").read()
    m = re.search(r'<script type="application/json" id="lopper-data">(.*?)</script>', text, re.S)
    assert m, "no data element in the page"
    return json.loads(m.group(1))


def check_drawn(browser, page, tmp, sections):
    """The page drew without an error, with at least the charts its `sections` call for."""
    text = open(page, encoding="utf-8").read()
    # Self-contained: nothing is loaded from anywhere.
    assert not re.search(r'<(script|link|img)[^>]+(src|href)=', text), "the page loads a file"
    p = probe(browser, page, tmp)
    assert not p.errors.strip() and "data-errors" not in p.body, f"script errors: {p.errors!r}"
    charts = int(p.body.get("data-charts", "0"))
    want = {"summary": 1, "target": 1, "layers": 3, "chosen": 1, "sensitivity": 2, "tradeoff": 1,
            "training": 2}
    need = sum(want[s] for s in sections)
    assert charts == need, f"{charts} charts drawn, the sections {sections} make {need}"
    assert len(p.painted) == charts, f"{len(p.painted)} canvases for {charts} charts"
    blank = [i for i, n in enumerate(p.painted) if n < 500]
    assert not blank, f"charts {blank} painted almost nothing: {p.painted}"


def write_idx_subset(out, train=2048, test=512):
    """The first images and labels of Fashion-MNIST's two splits as plain IDX files (idx:DIR)."""
    os.makedirs(out)
    for prefix, n in (("train", train), ("t10k", test)):
        for kind, header, item in (("images-idx3-ubyte", 16, 28 * 28), ("labels-idx1-ubyte", 8, 1)):
            with gzip.open(os.path.join(FASHION, f"{prefix}-{kind}.gz"), "rb") as f:
                head = bytearray(f.read(header))
                body = f.read(n * item)
            head[4:8] = struct.pack(">I", n)
            with open(os.path.join(out, f"{prefix}-{kind}"), "wb") as f:
                f.write(bytes(head) + body)


def lopper(*args):
    return subprocess.run(list(args), check=True, capture_output=True, text=True)


def main():
    exe, fixtures = sys.argv[1], sys.argv[2]
    browser = chromium()
    tmp = tempfile.mkdtemp(prefix="lopper-reports-")
    data = os.path.join(tmp, "fmnist")
    write_idx_subset(data)
    idx = "idx:" + data
    lenet = os.path.join(EXAMPLES, "lenet300_100.onnx")
    cnn = os.path.join(fixtures, "small_cnn.preserve.onnx")

    def unstructured():
        out, page = os.path.join(tmp, "l1.onnx"), os.path.join(tmp, "l1.html")
        lopper(exe, "prune", lenet, "-o", out, "--method", "l1", "--amount", "0.8", "--data", idx,
               "--split", "test", "--batch-size", "64", "--eval-batches", "2", "--report", page)
        check_drawn(browser, page, tmp, ["summary", "layers", "tradeoff"])
        d, j = page_data(page), json.load(open(out + ".report.json"))
        before, after = d["models"]
        assert after["nonzero"] == before["nonzero"] - (j["nonzero_before"] - j["nonzero"]), \
            "the page's nonzero count is not the prune's"
        assert after["file_bytes"] == j["file_bytes_after"]
        assert 0 <= after["top1"] <= 1 and "128 samples" in after["measured"], after["measured"]
        assert [l["name"] for l in d["layers"]] == [l["name"] for l in j["layers"]]
        for pl, jl in zip(d["layers"], j["layers"]):
            assert pl["nonzero"] == [jl["nonzero_before"], jl["nonzero"]], pl["name"]

    def structured():
        out, page = os.path.join(tmp, "ch.onnx"), os.path.join(tmp, "ch.html")
        lopper(exe, "prune", cnn, "-o", out, "--structured", "channel", "--amount", "0.5",
               "--report", page)
        check_drawn(browser, page, tmp, ["summary", "layers"])
        d, j = page_data(page), json.load(open(out + ".report.json"))
        assert [m["params"] for m in d["models"]] == [j["params_before"], j["params"]]
        assert [m["macs"] for m in d["models"]] == [j["macs_before"], j["macs"]]
        assert "top1" not in d["models"][0], "top-1 without data"
        # Per layer the page draws the share removed (no zeros to show as sparsity): the layers'
        # parameters before and after, as the shrunk model has them.
        assert any(l["params"][1] < l["params"][0] for l in d["layers"]), d["layers"]
        assert all(l["nonzero"] == l["params"] for l in d["layers"])

    def target():
        out, page = os.path.join(tmp, "t.onnx"), os.path.join(tmp, "t.html")
        lopper(exe, "prune", lenet, "-o", out, "--target-params", "0.2", "--data", idx,
               "--eval-batches", "2", "--report", page)
        check_drawn(browser, page, tmp,
                    ["summary", "target", "layers", "chosen", "sensitivity", "tradeoff"])
        d, j = page_data(page), json.load(open(out + ".report.json"))
        assert d["target"]["measured"] == j["target"]["measured"]
        assert [c["amount"] for c in d["chosen"]] == [l["amount"] for l in j["layers"]]

    def target_from_file():
        # The sweep from a file, --data only to measure the model before and after for the page.
        sens, out = os.path.join(tmp, "ls.json"), os.path.join(tmp, "tf.onnx")
        page = os.path.join(tmp, "tf.html")
        lopper(exe, "sensitivity", lenet, "--data", idx, "--amounts", "0.5,0.9", "--eval-batches",
               "2", "-o", sens)
        lopper(exe, "prune", lenet, "-o", out, "--target-params", "0.3", "--sensitivity", sens,
               "--data", idx, "--eval-batches", "2", "--report", page)
        check_drawn(browser, page, tmp,
                    ["summary", "target", "layers", "chosen", "sensitivity", "tradeoff"])
        j = json.load(open(out + ".report.json"))
        assert "top1_measured" in j["target"]["loss"], "no top-1 after pruning"
        assert page_data(page)["models"][1]["top1"] == j["target"]["loss"]["top1_measured"]

    def sensitivity():
        out, page = os.path.join(tmp, "s.json"), os.path.join(tmp, "s.html")
        lopper(exe, "sensitivity", cnn, "--data", idx, "--structured", "channel", "--amounts",
               "0.25,0.5,0.75", "--eval-batches", "2", "-o", out, "--report", page)
        # One model: its summary is a table without the after/before chart.
        check_drawn(browser, page, tmp, ["layers", "sensitivity", "tradeoff"])
        d, j = page_data(page), json.load(open(out))
        assert [l["name"] for l in d["sensitivity"]["layers"]] == [l["name"] for l in j["layers"]]
        assert d["sensitivity"]["layers"][0]["points"][1]["top1"] == j["layers"][0]["points"][1]["top1"]

    def train():
        out, page = os.path.join(tmp, "tr.onnx"), os.path.join(tmp, "tr.html")
        lopper(exe, "train", lenet, "--data", idx, "-o", out, "--epochs", "3", "--batch-size",
               "128", "--lr", "0.05", "--schedule", "agp", "--prune-method", "l1",
               "--prune-amount", "0.8", "--start-epoch", "0", "--end-epoch", "2", "--report", page)
        check_drawn(browser, page, tmp, ["summary", "layers", "tradeoff", "training"])
        d, j = page_data(page), json.load(open(out + ".train.json"))
        assert [e["loss"] for e in d["training"]["epochs"]] == [e["loss"] for e in j["epochs"]]
        assert d["training"]["eval"]["top1"] == j["eval"]["top1"]
        assert len(d["training"]["steps"]) >= 3 * 16, "the per-step curve lost its steps"

    def compare():
        # The model before and after the unstructured prune above, side by side.
        pruned, page = os.path.join(tmp, "l1.onnx"), os.path.join(tmp, "cmp.html")
        js = os.path.join(tmp, "cmp.json")
        lopper(exe, "compare", lenet, pruned, "--iters", "20", "--threads", "1", "-o", js,
               "--report", page)
        check_drawn(browser, page, tmp, ["summary", "layers"])
        d, j = page_data(page), json.load(open(js))
        assert d["kind"] == "compare"
        for m, key in zip(d["models"], ("before_measured", "after_measured")):
            assert m["nonzero"] == j[key]["nonzero"] and m["file_bytes"] == j[key]["file_bytes"]
            assert m["latency_ms"] == j[key]["latency_ms"]

    def control():
        # The probe sees a page that cannot draw: Chart.js removed from a report lopper wrote.
        page = os.path.join(tmp, "ch.html")
        broken = os.path.join(tmp, "broken.html")
        text = open(page, encoding="utf-8").read()
        start = text.index("<script>", text.index("window.lopperError")) + len("<script>")
        text = text[:start] + text[text.index("</script>", start):]
        open(broken, "w", encoding="utf-8").write(text)
        p = probe(browser, broken, tmp)
        assert "Chart is not defined" in p.errors and p.body.get("data-errors"), \
            f"a page without Chart.js went unnoticed: {p.errors!r}"

    rc = cases.run([("prune --method l1 --report (top-1 on --data)", unstructured),
                      ("prune --structured channel --report", structured),
                      ("prune --target-params --data --report", target),
                      ("prune --target-params --sensitivity FILE --data --report",
                       target_from_file),
                      ("sensitivity --structured channel --report", sensitivity),
                      ("train --schedule agp --report", train),
                      ("compare -o --report", compare),
                      ("control: a report without Chart.js shows its error", control)])
    if rc:
        print(f"the files are kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
