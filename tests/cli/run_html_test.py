#!/usr/bin/env python3
"""`kiln profile --html` in a real headless browser (Debian's chromium): for the sample CNN and
transformer, the page references nothing outside itself, its script draws without an error
(`data-rendered="ok"`, an empty `#errors`), the roofline has a point per node with FLOPs and its
compute and bandwidth roofs, the timeline a bar per event; a screenshot (kept in --artifacts)
shows the roofline's colours. Negative cases prove the DOM checks can fail (a corrupt embedded
document must put an error on the page), and hostile node names stay text. chromium missing is a
failure, not a skip: scripts/install-deps.sh installs it."""
import argparse
import html.parser
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

from checks import Checks
from run_cli_tests import ROOT

# The exact colours profile/html.cc draws the roofline with (its CSS).
COMPUTE_ROOF = (0xd6, 0x00, 0x6e)
BANDWIDTH_ROOF = (0x00, 0x8c, 0x46)
COMPUTE_POINT = (0xff, 0x78, 0x00)
MEMORY_POINT = (0x1e, 0x5a, 0xdc)
LEGEND_POINTS = 150  # more than the pixels of the legend's two point swatches


# ---- a small PNG decoder (no PIL in the venv): 8-bit greyscale, RGB or RGBA, not interlaced ----

def decode_png(data):
    """The image as a uint8 array [height, width, channels]."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if header is None:
        raise ValueError("no IHDR")
    width, height, depth, colour, _, _, interlace = header
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(colour)
    if depth != 8 or channels is None or interlace != 0:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}, interlace {interlace}")
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8)
    stride = width * channels
    if raw.size != height * (stride + 1):
        raise ValueError("IDAT size does not match IHDR")
    rows = raw.reshape(height, stride + 1)
    filters = rows[:, 0].astype(np.int32)
    if filters.max(initial=0) > 4:
        raise ValueError("bad filter type")
    # Each byte's predictor reads its left (a), upper (b) and upper-left (c) neighbours, already
    # decoded: pixels on one anti-diagonal (row + column constant) are independent, so a
    # wavefront decodes them together, each with its row's filter.
    filt = rows[:, 1:].reshape(height, width, channels).astype(np.int32)
    out = np.zeros((height + 1, width + 1, channels), dtype=np.int32)  # a zero row and column of padding
    for d in range(height + width - 1):
        r = np.arange(max(0, d - width + 1), min(height, d + 1))
        c = d - r
        a, b, up_left = out[r + 1, c], out[r, c + 1], out[r, c]
        ft = filters[r][:, None]
        p = a + b - up_left
        pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - up_left)
        paeth = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, up_left))
        pred = np.select([ft == 0, ft == 1, ft == 2, ft == 3], [0, a, b, (a + b) // 2], paeth)
        out[r + 1, c + 1] = (filt[r, c] + pred) & 0xFF
    return out[1:, 1:].astype(np.uint8)


def encode_png(image, filters):
    """A PNG of `image` [h, w, 3] with the given filter type per row: the decoder's test oracle."""
    h, w, ch = image.shape
    img = image.astype(np.int32)
    lines = []
    for y in range(h):
        cur = img[y].reshape(-1)
        prev = img[y - 1].reshape(-1) if y > 0 else np.zeros_like(cur)
        left = np.concatenate([np.zeros(ch, np.int32), cur[:-ch]])
        up_left = np.concatenate([np.zeros(ch, np.int32), prev[:-ch]])
        ft = filters[y]
        if ft == 0:
            f = cur
        elif ft == 1:
            f = cur - left
        elif ft == 2:
            f = cur - prev
        elif ft == 3:
            f = cur - (left + prev) // 2
        else:
            p = left + prev - up_left
            pa, pb, pc = np.abs(p - left), np.abs(p - prev), np.abs(p - up_left)
            f = cur - np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prev, up_left))
        lines.append(bytes([ft]) + (f & 0xFF).astype(np.uint8).tobytes())

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    raw = zlib.compress(b"".join(lines))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", raw[:len(raw) // 2]) + chunk(b"IDAT", raw[len(raw) // 2:]) + chunk(b"IEND", b""))


def colour_pixels(image, rgb, tolerance=6):
    """How many pixels are within `tolerance` of `rgb` in every channel (opaque ones only)."""
    px = image[..., :3].astype(np.int16)
    near = np.all(np.abs(px - np.array(rgb, np.int16)) <= tolerance, axis=-1)
    if image.shape[-1] == 4:
        near &= image[..., 3] == 255
    return int(near.sum())


# ---- the page ----

class Elements(html.parser.HTMLParser):
    """Every start tag with its attributes and the chain of ids it sits in; the text of #errors."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.stack, self.errors_text, self.errors_depth = [], [], [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        ids = [a.get("id") for _, a in self.stack if a.get("id")]
        self.tags.append((tag, attrs, ids))
        if tag not in ("meta", "br", "link", "img", "input", "hr", "source", "col"):
            self.stack.append((tag, attrs))
        if attrs.get("id") == "errors":
            self.errors_depth = len(self.stack)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs), [a.get("id") for _, a in self.stack if a.get("id")]))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break
        if self.errors_depth is not None and len(self.stack) < self.errors_depth:
            self.errors_depth = None

    def handle_data(self, data):
        if self.errors_depth is not None:
            self.errors_text.append(data)

    def inside(self, id_, tag=None, cls=None):
        return [(t, a) for t, a, ids in self.tags if id_ in ids and (tag is None or t == tag)
                and (cls is None or cls in (a.get("class") or "").split())]

    def by_id(self, id_):
        return [(t, a) for t, a, _ in self.tags if a.get("id") == id_]


def external_references(text):
    """What in the page would reach outside it: URLs, files, imports, fetches."""
    problems = []
    for pattern, what in ((r"https?://", "a URL"), (r"@import", "a CSS @import"), (r"\bfetch\s*\(", "fetch()"),
                          (r"XMLHttpRequest|WebSocket|EventSource|navigator\.sendBeacon", "a network API"),
                          (r"\bimport\s*\(", "a dynamic import")):
        if re.search(pattern, text):
            problems.append(what)
    for m in re.finditer(r"url\(\s*['\"]?([^)'\"]*)", text):
        if not m.group(1).startswith(("data:", "#")):
            problems.append(f"url({m.group(1)})")
    page = Elements()
    page.feed(text)
    for tag, attrs, _ in page.tags:
        if tag in ("link", "img", "iframe", "frame", "object", "embed", "video", "audio", "source", "track", "base", "image", "use"):
            problems.append(f"a <{tag}> element")
        for name in ("src", "href", "xlink:href", "srcset", "action", "poster", "data"):
            if name in attrs and not str(attrs[name]).startswith(("#", "data:")):
                problems.append(f"<{tag} {name}={attrs[name]!r}>")
    return problems


class Browser:
    def __init__(self, chromium, work):
        self.chromium, self.work, self.runs = chromium, work, 0

    def _run(self, url, extra, timeout=90):
        self.runs += 1
        profile = os.path.join(self.work, f"chromium-profile-{self.runs}")
        cmd = [self.chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-extensions", "--disable-dev-shm-usage", "--host-resolver-rules=MAP * ~NOTFOUND",
               f"--user-data-dir={profile}", "--virtual-time-budget=5000"] + extra + [url]
        # chromium prints dbus and GPU noise on stderr: only the DOM and the screenshot are judged.
        p = subprocess.run(cmd, capture_output=True, timeout=timeout, cwd=self.work)
        shutil.rmtree(profile, ignore_errors=True)
        return p

    def dom(self, path):
        p = self._run("file://" + os.path.abspath(path), ["--dump-dom"])
        return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")

    def screenshot(self, path, png):
        p = self._run("file://" + os.path.abspath(path),
                      [f"--screenshot={png}", "--window-size=1400,1800", "--hide-scrollbars", "--force-color-profile=srgb"])
        return p.returncode, p.stderr.decode(errors="replace")


def rendered(dom_text):
    """(data-rendered is "ok", the text in #errors, the parsed DOM)."""
    page = Elements()
    page.feed(dom_text)
    body = [a for t, a, _ in page.tags if t == "body"]
    ok = bool(body) and body[0].get("data-rendered") == "ok"
    return ok, "".join(page.errors_text).strip(), page


def embedded(text):
    """The document embedded in a page, and where its JSON starts and ends."""
    m = re.search(r'<script type="application/json" id="profile-data">(.*?)</script>', text, re.S)
    if not m:
        raise ValueError("no #profile-data block")
    return json.loads(m.group(1)), m.start(1), m.end(1)


def reembed(text, doc):
    """The page with another document embedded, escaped as kiln escapes it."""
    _, start, end = embedded(text)
    data = json.dumps(doc, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return text[:start] + data + text[end:]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--artifacts", default=None, help="folder for the screenshots (default: a temporary one)")
    ap.add_argument("--chromium", default=os.environ.get("KILN_CHROMIUM", "chromium"))
    args = ap.parse_args()
    r = Checks()
    chromium = shutil.which(args.chromium)
    if not chromium:
        r.check("chromium", False, f"{args.chromium!r} not found: scripts/install-deps.sh installs Debian's chromium")
        return r.report()
    work = tempfile.mkdtemp(prefix="kiln-html-")
    artifacts = os.path.abspath(args.artifacts) if args.artifacts else os.path.join(work, "artifacts")
    os.makedirs(artifacts, exist_ok=True)
    started = time.monotonic()
    try:
        run_all(r, os.path.abspath(args.kiln), Browser(chromium, work), work, artifacts)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"screenshots in {artifacts}; {time.monotonic() - started:.1f} s")
    return r.report()


def run_all(r, kiln, browser, work, artifacts):
    # The decoder first, on an image that uses every filter type, split over two IDAT chunks.
    rng = np.random.default_rng(7)
    image = rng.integers(0, 256, size=(23, 17, 3), dtype=np.uint8)
    image[5:12] = image[4]  # runs that Up and Sub filters make small
    filters = [i % 5 for i in range(23)]
    try:
        r.check("png_decoder", np.array_equal(decode_png(encode_png(image, filters)), image), "decoded image differs")
    except ValueError as e:
        r.check("png_decoder", False, str(e))

    env = dict(os.environ, XDG_CACHE_HOME=os.path.join(work, "cache"))

    def kiln_run(args):
        p = subprocess.run([kiln] + args, capture_output=True, cwd=work, env=env)
        return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")

    pages = {}
    for name in ("cnn", "transformer"):
        rc, _, err = kiln_run(["export", os.path.join(ROOT, "samples", name + ".onnx"), "-o", name + ".kiln"])
        if not r.check(f"export_{name}", rc == 0, err[:400]):
            continue
        rc, out, err = kiln_run(["profile", name + ".kiln", "--iters", "20", "--html", name + ".html", "--json"])
        page = os.path.join(work, name + ".html")
        if not r.check(f"profile_{name}", rc == 0 and os.path.exists(page), f"exit {rc}; {err[:400]!r}"):
            continue
        doc = json.loads(out)
        text = open(page, encoding="utf-8").read()
        pages[name] = (page, text, doc)

        # Self-contained: nothing outside the page, and the embedded document is the --json one.
        problems = external_references(text)
        r.check(f"self_contained_{name}", not problems, "; ".join(problems[:10]))
        try:
            inside, _, _ = embedded(text)
            r.check(f"embedded_{name}", inside == doc, "the embedded document differs from the --json one")
        except ValueError as e:
            r.check(f"embedded_{name}", False, str(e))

        # The page in the browser.
        rc, dom, err = browser.dom(page)
        ok, errors, parsed = rendered(dom)
        r.check(f"rendered_{name}", rc == 0 and ok and errors == "",
                f"exit {rc}; rendered {ok}; #errors {errors[:400]!r}; stderr {err[-400:]!r}")
        if "model_file_resident_bytes" in doc["memory"]:  # the model file's pages, in the header's rows
            row = r"2 MiB pages.*model file [0-9.]+ [KMG]?i?B of [0-9.]+ [KMG]?i?B resident"
            r.check(f"pages_row_{name}", re.search(row, dom, re.S), f"no '2 MiB pages' row in {dom[:600]!r}")
        with_flops = sum(1 for n in doc["nodes"] if n["flops"] > 0)
        points = parsed.inside("roofline-svg", "circle", "rl-point")
        r.check(f"roofline_points_{name}", len(points) == with_flops and with_flops > 0,
                f"{len(points)} points, {with_flops} nodes with FLOPs")
        ceilings = doc["machine"]["ceilings"]
        compute_roofs = parsed.inside("roofline-svg", "line", "rl-roof-compute")
        memory_roofs = parsed.inside("roofline-svg", "line", "rl-roof-memory")
        r.check(f"roofline_roofs_{name}", len(compute_roofs) == len(ceilings["compute_gflops"])
                and len(memory_roofs) == len(ceilings["memory"]),
                f"{len(compute_roofs)} compute roofs for {list(ceilings['compute_gflops'])}, "
                f"{len(memory_roofs)} bandwidth roofs for {[m['level'] for m in ceilings['memory']]}")
        titles = parsed.inside("roofline-svg", "title")
        r.check(f"roofline_titles_{name}", len(titles) >= len(points) + len(compute_roofs) + len(memory_roofs),
                f"{len(titles)} hover titles")
        zero = len(doc["nodes"]) - with_flops
        left_out = parsed.by_id("roofline-left-out")
        r.check(f"roofline_left_out_{name}", len(left_out) == 1, "no note of the nodes left off the plot")
        bars = parsed.inside("timeline-svg", "rect", "tl-bar")
        events = doc["timeline"]["events"]
        r.check(f"timeline_{name}", len(bars) == len(events) == len(doc["nodes"]) and parsed.inside("timeline-svg", "rect", "tl-gap"),
                f"{len(bars)} bars, {len(events)} events")
        rows = parsed.inside("nodes", "tr")
        r.check(f"tables_{name}", len(rows) == len(doc["nodes"]) + 1
                and len(parsed.inside("by-op", "tr")) == len(doc["by_op"]) + 1
                and len(parsed.inside("by-kernel", "tr")) == len(doc["by_kernel"]) + 1,
                f"{len(rows)} node table rows for {len(doc['nodes'])} nodes")
        if name == "cnn":
            r.check("cnn_has_data_movement", zero > 0, "the CNN's transposes should be left off the plot")

        # The screenshot shows the plot: its roofs' and points' colours are on it.
        png = os.path.join(artifacts, f"profile_{name}.png")
        if os.path.exists(png):
            os.remove(png)
        rc, err = browser.screenshot(page, png)
        try:
            image = decode_png(open(png, "rb").read())
            counts = {what: colour_pixels(image, rgb) for what, rgb in
                      (("compute roof", COMPUTE_ROOF), ("bandwidth roof", BANDWIDTH_ROOF),
                       ("compute-bound point", COMPUTE_POINT), ("memory-bound point", MEMORY_POINT))}
            good = (image.shape[0] == 1800 and image.shape[1] == 1400 and counts["compute roof"] >= 400
                    and counts["bandwidth roof"] >= 400 and counts["compute-bound point"] + counts["memory-bound point"] >= LEGEND_POINTS + 20 * with_flops)
            detail = f"{image.shape}; pixels {counts}"
        except (OSError, ValueError) as e:
            good, detail = False, f"exit {rc}: {e}; stderr {err[-400:]!r}"
        r.check(f"screenshot_{name}", good, detail)
        print(f"{name}: {len(points)} points, {len(bars)} bars; screenshot {detail}")

    if "cnn" not in pages:
        return
    page, text, doc = pages["cnn"]

    # An unwritable --html is a user error naming the file, as for --trace.
    rc, out, err = kiln_run(["profile", "cnn.kiln", "--iters", "1", "--html", "no/such/dir/r.html"])
    lines = [l for l in err.splitlines() if l.strip()]
    r.check("html_unwritable", rc == 2 and len(lines) == 1 and lines[0].startswith("kiln profile: error: ") and "r.html" in lines[0]
            and out == "", f"exit {rc}; stderr {err[:300]!r}")

    # The checks can fail: a document the script cannot read puts an error on the page.
    bad = json.loads(json.dumps(doc))
    bad["nodes"][1]["flops"] = "many"
    cases = {"corrupt_flops": reembed(text, bad)}
    _, start, end = embedded(text)
    cases["truncated_json"] = text[:start] + text[start:end][: (end - start) // 2] + text[end:]
    for case, broken in cases.items():
        path = os.path.join(work, case + ".html")
        open(path, "w", encoding="utf-8").write(broken)
        rc, dom, err = browser.dom(path)
        ok, errors, _ = rendered(dom)
        r.check(f"negative_{case}", rc == 0 and not ok and errors.startswith("error:"),
                f"exit {rc}; rendered {ok}; #errors {errors[:300]!r}")

    # Hostile names stay text: a node named like markup neither ends the data block nor becomes
    # elements, and the page still draws.
    hostile = json.loads(json.dumps(doc))
    names = ["</script><script>document.title='pwned'</script>", "<img src=x onerror=\"document.title='pwned'\">",
             "<!-- & </style>"]
    for n, name in zip(hostile["nodes"], names):
        n["name"] = name
    hostile["model"]["file"] = "<b>bold</b>.kiln"
    path = os.path.join(work, "hostile.html")
    open(path, "w", encoding="utf-8").write(reembed(text, hostile))
    rc, dom, err = browser.dom(path)
    ok, errors, parsed = rendered(dom)
    injected = [t for t, _, _ in parsed.tags if t in ("img", "b")]
    title = re.search(r"<title>(.*?)</title>", dom, re.S)  # the page's own, in <head>: a script that ran would set it
    r.check("hostile_names", rc == 0 and ok and errors == "" and not injected and title and "pwned" not in title.group(1)
            and "&lt;img src=x" in dom, f"exit {rc}; rendered {ok}; #errors {errors[:300]!r}; injected {injected}")


if __name__ == "__main__":
    sys.exit(main())
