"""The widgets in a real JupyterLab, driven by headless Debian Chromium through Playwright.

Starts `jupyter lab` on a free loopback port with a token, opens a generated notebook, runs all
cells, and checks the DOM: the tree's node count, trained and untrained chips of a two-turn concat
row, reward numbers that follow the discount slider, clipped tokens marked in the loss view (and
kept by its "clipped" filter), the lab's lanes (one per variant, disagreements highlighted, a
variant picker), and a dashboard that grows by one point
after a training step (without re-running its cell). Screenshots go to artifacts/screenshots/.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .make_notebook import write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROME_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
SETTINGS = Path(__file__).parent / "jupyterlab_settings"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def jupyterlab(tmp_path):
    with serve_notebook(tmp_path, write_notebook, "widgets.ipynb") as url:
        yield url


@contextlib.contextmanager
def serve_notebook(tmp_path: Path, write: Callable[[Path], Path], name: str) -> Iterator[str]:
    """JupyterLab on loopback serving the notebook `write(path)` writes; yields its URL."""
    pytest.importorskip("playwright.sync_api", reason="playwright is needed for the browser test")
    if not Path(CHROMIUM).exists():
        pytest.skip(
            f"no Chromium at {CHROMIUM}: install it with `apt-get install chromium` (CI does, in "
            ".ci/run) or point CHROMIUM_PATH at one"
        )
    try:
        import areal_nb.session  # noqa: F401
    except ImportError as e:  # the notebook drives a Session; nothing else may skip this test
        pytest.skip(f"!!! areal_nb.session cannot be imported ({e}); the browser test needs the Session !!!")
    root = tmp_path / "nb"
    root.mkdir()
    write(root / name)
    settings = tmp_path / "settings"
    shutil.copytree(SETTINGS, settings)  # silences the news / update toasts
    token = secrets.token_urlsafe(16)
    port = _free_port()
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
        OMP_NUM_THREADS="1",
    )
    log = open(tmp_path / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=root,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "JupyterLab did not start:\n" + (tmp_path / "jupyterlab.log").read_text()
                    ) from None
                time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/lab/tree/{name}?token={token}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # JupyterLab and the kernels it started
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _ints(page, selector: str, attr: str) -> list[int]:
    return [
        int(v) for v in page.eval_on_selector_all(selector, f"els => els.map(e => e.getAttribute('{attr}'))")
    ]


def test_widgets_in_jupyterlab(jupyterlab, tmp_path):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROME_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            page = browser.new_page()
            page.goto(jupyterlab)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            select_kernel = page.locator(".jp-Dialog button.jp-mod-accept")  # JupyterLab may ask once
            try:
                select_kernel.click(timeout=8_000)
            except Exception:  # no dialog: the kernel started on its own
                pass
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
            page.click("text=Run", timeout=10_000)
            page.click("text=Run All Cells", timeout=10_000)
            # the last cell prints once the session trained a step
            errors = page.locator(
                ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']", has_text="Traceback"
            )
            deadline = time.monotonic() + 240
            while page.locator("text=trained step 1").count() == 0:  # the last cell prints after a step
                assert errors.count() == 0, (
                    "a notebook cell failed:\n" + "\n".join(errors.all_inner_texts())[-3000:]
                )
                assert time.monotonic() < deadline, "the notebook did not finish its training step"
                page.wait_for_timeout(500)
            page.screenshot(path=str(SHOTS / "notebook.png"), full_page=True)

            # 1. tree: one node per call: 2 turns in episode 0
            tree = page.locator(".anb-tree-view svg.anb-tree").first
            tree.scroll_into_view_if_needed()
            assert tree.get_attribute("data-nodes") == "2"
            assert page.locator(".anb-tree-view g.anb-node").count() == 2
            assert page.locator(".anb-tree-view g.anb-node.anb-leaf").count() == 1
            tree.screenshot(path=str(SHOTS / "tree.png"))

            # 2. tokens: a two-turn concat row has trained and untrained chips, in two turn bands
            tokens = page.locator(".anb-token-view .anb-row[data-style='concat']").first
            assert tokens.locator(".anb-chip.anb-loss").count() > 0
            assert tokens.locator(".anb-chip.anb-noloss").count() > 0
            assert sorted(
                set(_ints(page, ".anb-token-view .anb-row[data-style='concat'] .anb-band", "data-turn"))
            ) == [-1, 0, 1]
            page.locator(".anb-token-view").first.screenshot(path=str(SHOTS / "tokens.png"))

            # 3. rewards: moving the discount slider changes the first turn's reward
            view = page.locator(".anb-reward-view").first
            view.scroll_into_view_if_needed()
            before = view.locator("g.anb-node").first.get_attribute("data-reward")
            readout = view.locator(".widget-readout").first
            readout.click()
            page.keyboard.press("Control+A")
            page.keyboard.type("0.5")
            page.keyboard.press("Enter")
            page.wait_for_selector(".anb-reward-view .anb-reward-head[data-gamma='0.5']", timeout=20_000)
            after = view.locator("g.anb-node").first.get_attribute("data-reward")
            assert (before, after) == ("1", "0.5")  # own 0 + γ · leaf 1: γ 1 → 0.5
            view.screenshot(path=str(SHOTS / "rewards.png"))

            # 4. loss: clipped tokens are marked (as many as the inspection has), and the
            #    "clipped" filter keeps only the row that holds them
            loss = page.locator(".anb-loss-view").first
            loss.scroll_into_view_if_needed()
            n_clipped = int(page.locator("text=/clipped tokens \\d+/").first.inner_text().split()[-1])
            assert n_clipped > 0
            assert loss.locator(".anb-chip.anb-clipped").count() == n_clipped
            assert loss.locator(".anb-chip.anb-clipped[data-clipped='1']").count() == n_clipped
            assert loss.locator(".anb-loss-row").count() == 2
            loss.screenshot(path=str(SHOTS / "loss.png"))
            loss.locator("button", has_text="clipped").first.click()
            page.wait_for_selector(".anb-loss-view .anb-loss[data-filter='clipped']", timeout=20_000)
            assert loss.locator(".anb-loss-row").count() == 1
            assert loss.locator(".anb-chip.anb-clipped").count() == n_clipped
            assert loss.locator(".anb-chip.anb-clipped.anb-dim").count() == 0
            loss.screenshot(path=str(SHOTS / "loss_clipped.png"))

            # 5. the lab: one lane per variant under each token, the disagreeing tokens highlighted
            #    (as many as the cell printed); the variant picker hides a lane
            lab = page.locator(".anb-compare-view").first
            lab.scroll_into_view_if_needed()
            printed = page.locator("text=/lab lanes 3 disagree \\d+/").first.inner_text().split()
            n_tokens = lab.locator(".anb-compare-token").count()
            assert n_tokens > 0 and lab.locator(".anb-lane").count() == 3 * n_tokens
            assert lab.locator(".anb-compare-token.anb-disagree").count() == int(printed[-1]) > 0
            lab.screenshot(path=str(SHOTS / "compare.png"))
            lab.locator("select").last.select_option(["grpo", "cispo"])
            page.wait_for_function(
                "document.querySelectorAll('.anb-compare-view .anb-lane[data-variant=\"dr_grpo\"]')"
                ".length === 0",
                timeout=20_000,
            )
            assert lab.locator(".anb-lane").count() == 2 * n_tokens

            # 6. dashboard: one point per step; a new step adds one without re-running its cell
            dash = page.locator(".anb-dashboard-view").first
            dash.scroll_into_view_if_needed()
            assert dash.locator(".anb-dashboard").get_attribute("data-steps") == "1"
            assert dash.locator("svg.anb-plot[data-metric='loss']").get_attribute("data-points") == "1"
            page.locator(".jp-Cell").last.click()
            page.keyboard.press("Shift+Enter")
            page.wait_for_selector(".anb-dashboard-view .anb-dashboard[data-steps='2']", timeout=120_000)
            assert dash.locator("svg.anb-plot[data-metric='loss']").get_attribute("data-points") == "2"
            dash.screenshot(path=str(SHOTS / "dashboard.png"))
        except Exception:
            page.screenshot(path=str(SHOTS / "failure.png"), full_page=True)
            (SHOTS / "failure.html").write_text(page.content())
            raise
        finally:
            browser.close()
