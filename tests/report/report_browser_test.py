#!/usr/bin/env python3
"""Opens a `sluice report` page in headless Chromium and checks what a person would see.

    report_browser_test.py --sluice BIN      trains a small 2-stage pipeline run, writes its report
                                             and checks it
    report_browser_test.py --html PAGE --stages N --steps N
                                             checks an existing page (the fixture run uses this to
                                             show that the checks fail on a broken page)

Checks, on the page as Chromium renders it (its DOM after the page's script ran, and a screenshot):
  - one Gantt row (<g class="gantt-row">) per pipeline stage,
  - one loss point (<circle class="loss-point">) per logged step,
  - nothing on the console (errors, warnings, failed loads: the page logs nothing when it works),
  - a screenshot that is not a single colour (at least 8 distinct colours).
Exits 0 when every check passes, 1 when one fails (saying which), 77 when Chromium is not installed
(CTest reports the test as skipped, never as passed). Only the Python standard library is used.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

SKIP = 77
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_browser():
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def run_browser(browser, profile, url, *args):
    """Runs headless Chromium once; returns (stdout, stderr)."""
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--disable-extensions", "--user-data-dir=" + profile,
           "--enable-logging=stderr", "--v=0", *args, url]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError("chromium exited with %d:\n%s" % (p.returncode, p.stderr[-3000:]))
    return p.stdout, p.stderr


def png_colours(path, limit=4096):
    """The set of distinct pixel values of a PNG (8-bit RGB/RGBA, non-interlaced), up to limit."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise RuntimeError("%s is not a PNG" % path)
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = header
    if depth != 8 or colour_type not in (2, 6) or interlace != 0:
        raise RuntimeError("unexpected PNG format: depth %d, colour type %d, interlace %d"
                           % (depth, colour_type, interlace))
    bpp = 3 if colour_type == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    prev = bytearray(stride)
    colours = set()
    for y in range(height):
        row_start = y * (stride + 1)
        kind = raw[row_start]
        row = bytearray(raw[row_start + 1:row_start + 1 + stride])
        if kind == 1:    # Sub
            for i in range(bpp, stride):
                row[i] = (row[i] + row[i - bpp]) & 0xFF
        elif kind == 2:  # Up
            row = bytearray((a + b) & 0xFF for a, b in zip(row, prev))
        elif kind == 3:  # Average
            for i in range(stride):
                left = row[i - bpp] if i >= bpp else 0
                row[i] = (row[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif kind == 4:  # Paeth
            for i in range(stride):
                a = row[i - bpp] if i >= bpp else 0
                b = prev[i]
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        for x in range(0, stride, bpp * 4):  # every 4th pixel is plenty to tell colours apart
            colours.add(bytes(row[x:x + bpp]))
        if len(colours) >= limit:
            break
        prev = row
    return colours


def check_page(browser, html, stages, steps, work):
    """Returns the list of failed checks (empty when the page is right)."""
    failures = []
    url = "file://" + os.path.abspath(html)
    dom, log = run_browser(browser, os.path.join(work, "profile-dom"), url, "--dump-dom")
    rows = dom.count('class="gantt-row"')
    points = dom.count('class="loss-point"')
    if rows != stages:
        failures.append("Gantt rows: %d on the page, %d stages in the run" % (rows, stages))
    if points != steps:
        failures.append("loss points: %d on the page, %d logged steps" % (points, steps))
    console = [line for line in log.splitlines() if ":CONSOLE" in line]
    if console:
        failures.append("console messages:\n    " + "\n    ".join(console))
    shot = os.path.join(work, "screenshot.png")
    run_browser(browser, os.path.join(work, "profile-shot"), url, "--screenshot=" + shot,
                "--window-size=1100,2400", "--force-device-scale-factor=0.5",
                "--hide-scrollbars")
    colours = png_colours(shot)
    if len(colours) < 8:
        failures.append("screenshot has %d colour%s: the page shows nothing"
                        % (len(colours), "" if len(colours) == 1 else "s"))
    print("report_browser_test: %d Gantt rows, %d loss points, %d console messages, %s%d colours "
          "in the screenshot" % (rows, points, len(console), ">=" if len(colours) >= 4096 else "",
                                 len(colours)))
    return failures


def make_report(sluice, work):
    """Trains a 2-stage pipeline run with metrics and a trace; returns (page, stages, steps)."""
    metrics = os.path.join(work, "metrics.jsonl")
    trace = os.path.join(work, "trace.json")
    page = os.path.join(work, "report.html")
    train = [sluice, "train", "--stages", "2", "--schedule", "1f1b", "--layers", "2", "--dim", "32",
             "--heads", "2", "--batch", "8", "--microbatches", "4", "--steps", "12",
             "--eval-every", "4", "--threads", "1", "--quiet", "--metrics", metrics,
             "--trace", trace]
    subprocess.run(train, check=True)
    out = subprocess.run([sluice, "report", metrics, "--trace", trace, "--out", page],
                         check=True, capture_output=True, text=True).stdout
    if page not in out:
        raise RuntimeError("sluice report did not print the page's path: %r" % out)
    steps = set()
    with open(metrics) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j and "step" in j and "summary" not in j:
                steps.add(j["step"])
    return page, 2, len(steps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sluice", help="the sluice binary: train a run and check its report")
    ap.add_argument("--html", help="check this page instead")
    ap.add_argument("--stages", type=int, help="with --html: the stages the page should show")
    ap.add_argument("--steps", type=int, help="with --html: the steps the page should show")
    args = ap.parse_args()
    browser = find_browser()
    if browser is None:
        print("report_browser_test: SKIPPED: no Chromium found (looked for %s on PATH); "
              "scripts/install-deps.sh installs Debian's chromium" % ", ".join(BROWSERS))
        return SKIP
    with tempfile.TemporaryDirectory(prefix="sluice_report_browser_") as work:
        if args.html:
            page, stages, steps = args.html, args.stages, args.steps
        else:
            page, stages, steps = make_report(args.sluice, work)
        failures = check_page(browser, page, stages, steps, work)
    for f in failures:
        print("report_browser_test: FAILED: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
