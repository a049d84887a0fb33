"""The two-agent example's views in a real JupyterLab, driven by headless Chromium: a Session on
configs/solver_checker.yaml rolls out a batch; its tree marks and names each call's agent, the
token view shows one row per agent, the reward view labels each row with its agent, and the
dashboard plots each agent's reward after a training step. Screenshots go to
artifacts/screenshots/agents_*.png."""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest

from .test_browser import CHROME_ARGS, CHROMIUM, ROOT, SHOTS, serve_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SETUP = f"""\
from areal_nb import Session
from areal_nb.config import load_config

config = load_config({str(ROOT / "configs" / "solver_checker.yaml")!r},
                     ["rollout.batch_size=1", "rollout.group_size=2", "rollout.max_new_tokens=8",
                      "data.eval_size=2", "logging.eval_every=0", "logging.progress=false"])
session = Session(config)
batch = session.rollout()
print("agents", batch.agents, [e.rejection_reason for e in batch.episodes])"""

CELLS = [
    SETUP,
    "tree = batch.show_tree(0)\ntree",
    "from areal_nb.widgets import show_tokens\n"
    "tokens = show_tokens(batch.episodes[0], tokenizer=session.tokenizer)\ntokens",
    "rewards = batch.show_rewards(0)\nrewards",
    "dash = session.dashboard()\ndash",
    "stats = session.train_step(batch)\nprint('trained step', stats['step'])",
]


def write_notebook(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


@pytest.fixture
def agents_notebook(tmp_path):
    with serve_notebook(tmp_path, write_notebook, "agents.ipynb") as url:
        yield url


def _attrs(page, selector: str, attr: str) -> list[str]:
    return page.eval_on_selector_all(selector, f"els => els.map(e => e.getAttribute('{attr}'))")


def test_the_views_show_the_agents(agents_notebook, tmp_path):
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
        page = browser.new_page()
        try:
            page.goto(agents_notebook)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            try:  # JupyterLab may ask once for the kernel
                page.locator(".jp-Dialog button.jp-mod-accept").click(timeout=8_000)
            except Exception:
                pass
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
            page.click("text=Run", timeout=10_000)
            page.click("text=Run All Cells", timeout=10_000)
            errors = page.locator(
                ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']", has_text="Traceback"
            )
            deadline = time.monotonic() + 240
            while page.locator("text=trained step 1").count() == 0:
                assert errors.count() == 0, (
                    "a notebook cell failed:\n" + "\n".join(errors.all_inner_texts())[-3000:]
                )
                assert time.monotonic() < deadline, "the notebook did not finish its training step"
                page.wait_for_timeout(500)
            page.screenshot(path=str(SHOTS / "agents_notebook.png"), full_page=True)

            # 1. tree: the episode's two calls, each marked and named with its agent, and a legend
            tree = page.locator(".anb-tree-view").first
            tree.scroll_into_view_if_needed()
            assert tree.locator(".anb-agents").first.get_attribute("data-agents") == "2"
            assert _attrs(page, ".anb-tree-view svg.anb-tree g.anb-node", "data-agent")[:2] == [
                "solver",
                "checker",
            ]
            assert tree.locator("svg.anb-tree rect.anb-agent-bar").count() == 2
            assert tree.locator("text=solver · turn 0").count() >= 1
            tree.screenshot(path=str(SHOTS / "agents_tree.png"))

            # 2. tokens: one concat row per agent, each headed by its agent
            tokens = page.locator(".anb-token-view").first
            tokens.scroll_into_view_if_needed()
            assert _attrs(page, ".anb-token-view .anb-row", "data-agent") == ["solver", "checker"]
            assert tokens.locator(".anb-row-agent").count() == 2
            tokens.screenshot(path=str(SHOTS / "agents_tokens.png"))

            # 3. rewards: every row of the group names its agent (its advantage is that agent's)
            rewards = page.locator(".anb-reward-view").first
            rewards.scroll_into_view_if_needed()
            cells = rewards.locator(".anb-adv-row td:nth-child(3)").all_inner_texts()
            assert sorted(c.split(":")[0] for c in cells) == ["checker", "checker", "solver", "solver"]
            rewards.screenshot(path=str(SHOTS / "agents_rewards.png"))

            # 4. dashboard: each agent's reward beside the total, one point after the step
            dash = page.locator(".anb-dashboard-view").first
            dash.scroll_into_view_if_needed()
            page.wait_for_selector(".anb-dashboard-view .anb-dashboard[data-steps='1']", timeout=60_000)
            for agent in ("solver", "checker"):
                plot = dash.locator(f"svg.anb-plot[data-metric='reward_mean/{agent}']")
                assert plot.get_attribute("data-points") == "1"
            dash.screenshot(path=str(SHOTS / "agents_dashboard.png"))
        except Exception:
            page.screenshot(path=str(SHOTS / "agents_failure.png"), full_page=True)
            (SHOTS / "agents_failure.html").write_text(page.content())
            raise
        finally:
            browser.close()
