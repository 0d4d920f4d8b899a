"""Make docs/img/report.png, the README's picture of the HTML report: a simulated prediction rendered by
headless Chromium (the system's). Rerun after a change to the report: python scripts/report_picture.py"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import trainsim

OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "report.png"


def main() -> None:
    browser = shutil.which("chromium") or shutil.which("google-chrome")
    if browser is None:
        sys.exit("error: no Chromium on this machine (apt-get install chromium)")
    prediction = trainsim.simulate(model="gpt3-1.3b", cluster="dgx-a100-80gb", num_gpus=8, pp=4, tp=2,
                                   micro_batch=1, global_batch=16, recompute="selective")
    with tempfile.TemporaryDirectory() as folder:
        page = prediction.write_html(Path(folder) / "report.html")
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1100,1900", "--virtual-time-budget=15000", f"--screenshot={OUT}",
                        page.as_uri()], check=True, capture_output=True, timeout=180)
    print(OUT)


if __name__ == "__main__":
    main()
