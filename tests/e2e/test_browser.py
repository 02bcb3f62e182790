"""The error browser (`report --html DIR`, mcwq_t5x.evaluation.browser) in a real headless browser:
Debian's chromium and chromium-driver (.ci/run installs them), driven by selenium, load the page
the README's report command writes for the published predictions from a file:// address, apply
filters, and count the rows shown against the report's numbers. One browser per session."""
import json
import os
import pathlib
import shutil
import tempfile

import pytest

from mcwq_t5x.evaluation import browser
import readme_commands as rc
import scenarios

pytestmark = pytest.mark.xdist_group(f"readme-{rc.chain(rc.REPORT)}")  # reads its README run

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")


@pytest.fixture(scope="module")
def driver():
  """A headless Chromium with a new empty profile, through the Debian chromium-driver."""
  if not (pathlib.Path(CHROMIUM).exists() and pathlib.Path(CHROMEDRIVER).exists()):
    message = (f"{CHROMIUM} and {CHROMEDRIVER} are needed: apt-get install -y chromium "
               "chromium-driver (.ci/run installs them)")
    if os.environ.get("CI"):
      pytest.fail(message)
    pytest.skip(message)
  from selenium import webdriver  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.chrome.service import Service  # pylint: disable=g-import-not-at-top
  profile = tempfile.mkdtemp(prefix="mcwq-chromium-")
  options = webdriver.ChromeOptions()
  for flag in FLAGS:
    options.add_argument(flag)
  options.add_argument(f"--user-data-dir={profile}")
  options.binary_location = CHROMIUM
  # The driver's path is given: selenium never looks one up or downloads one.
  chrome = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
  try:
    yield chrome
  finally:
    chrome.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_report(readme):
  """The README's report of the published predictions, with its error browser (read-only)."""
  scenarios.check(readme.result(rc.REPORT))
  return readme.repo / "runs/report"


def _open(driver, page, fragment=""):
  from selenium.webdriver.support.ui import WebDriverWait  # pylint: disable=g-import-not-at-top
  driver.get("about:blank")  # a new document, also when only the fragment differs
  driver.get(page.as_uri() + fragment)
  WebDriverWait(driver,
                60).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")


def _count(driver):
  return int(driver.find_element("id", "count").get_attribute("data-count"))


def _shown(driver):
  return len(driver.find_elements("css selector", "#rows tbody tr"))


def test_page_is_self_contained(shared_report):
  page = shared_report / "html" / browser.PAGE
  text = page.read_text(encoding="utf-8")
  assert "default-src 'none'" in text  # the page may request nothing
  before, rest = text.split('<script type="application/json" id="data">')
  code = before + rest.split("</script>", 1)[1]  # the page without its data
  for needle in ("http://", "https://", "<link", "src=", "url("):
    assert needle not in code, needle


def test_filters_count_the_reports_examples(driver, shared_report):
  """All rows, then the Hebrew gold-test predictions of the monolingual model that are right (75
  of 155, Table 6), then through a link of the report the 3,071 right mcd1 Hebrew predictions
  walked page by page."""
  from selenium.webdriver.support.ui import Select  # pylint: disable=g-import-not-at-top
  results = json.loads((shared_report / "results.json").read_text())
  page = shared_report / "html" / browser.PAGE
  _open(driver, page)
  assert _count(driver) == sum(r["n"] for r in results["runs"]) == 7 * 5310 + 3 * 155
  assert _shown(driver) == browser.DEFAULT_PAGE_SIZE
  gold_he = next(r for r in results["runs"]
                 if (r["language"], r["gold"], r["mode"]) == ("he", True, "monolingual"))
  for field, value in (("language", "he"), ("test", "gold"), ("mode", "monolingual"), ("category",
                                                                                       "correct")):
    Select(driver.find_element("id", f"f-{field}")).select_by_value(value)
  assert _count(driver) == _shown(driver) == gold_he["error_categories"]["correct"] == 75
  # The right answers show no highlighted difference; every row is the Hebrew gold set's.
  assert not driver.find_elements("css selector", "#rows tbody .del, #rows tbody .ins")
  assert {c.text for c in driver.find_elements("css selector", "#rows tbody tr td:nth-child(2)")
         } == {"he"}

  md = (shared_report / "report.md").read_text(encoding="utf-8")
  mcd1_he = next(r for r in results["runs"]
                 if (r["language"], r["gold"], r["mode"]) == ("he", False, "monolingual"))
  link = ("html/index.html#language=he&split=mcd1&test=test&model=mt5_small&mode=monolingual"
          "&category=correct")
  assert f"[{mcd1_he['error_categories']['correct']}]({link})" in md  # report.md's cell
  _open(driver, page, "#" + link.split("#", 1)[1])
  assert _count(driver) == mcd1_he["error_categories"]["correct"] == 3071
  Select(driver.find_element("id", "page-size")).select_by_value("1000")
  shown, pages = _shown(driver), 1
  while driver.find_element("id", "next").is_enabled():
    driver.find_element("id", "next").click()
    shown, pages = shown + _shown(driver), pages + 1
  assert (shown, pages) == (3071, 4)


def test_table_cell_links_to_its_examples(driver, shared_report):
  """A cell of the page's own error-category table (zero-shot kn, syntax errors) sets the filters
  of its examples."""
  from selenium.common.exceptions import TimeoutException  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.support.ui import WebDriverWait  # pylint: disable=g-import-not-at-top
  results = json.loads((shared_report / "results.json").read_text())
  zero_kn = next(r for r in results["runs"]
                 if (r["language"], r["mode"], r["gold"]) == ("kn", "zeroshot", False))
  page = shared_report / "html" / browser.PAGE
  _open(driver, page)
  driver.find_element("css selector", "#tables-box summary").click()
  fragment = browser.fragment(
      dict(
          language="kn",
          split="mcd1",
          test="test",
          model="mt5_small",
          mode="zeroshot",
          category="syntax_error"))
  driver.find_element("css selector", f'#tables a[href="{fragment}"]').click()
  expected = zero_kn["error_categories"]["syntax_error"]
  try:  # the page applies a link's filters when the address changes (an event)
    WebDriverWait(driver, 30).until(lambda d: _count(d) == expected)
  except TimeoutException:
    pass
  assert _count(driver) == _shown(driver) == expected == 21
  assert {c.text for c in driver.find_elements("css selector", "#rows tbody tr td:nth-child(7)")
         } == {"syntax_error"}


HOSTILE = ["<!--<script>", "</script><script>document.title = 'injected'</script>", "a & b <!-- c"]


def test_markup_in_predictions_is_shown_as_text(driver, tmp_path):
  """Predictions holding `<!--`, `<script>` and `</script>` (which once left the page with 0 rows,
  never ready) are shown as text, every row counted, nothing run."""
  from mcwq_t5x.data import rir  # pylint: disable=g-import-not-at-top
  from mcwq_t5x import report as report_cli  # pylint: disable=g-import-not-at-top
  gold = rir.sparql_to_rir("ASK WHERE { M0 wdt:P57 ?x0 }")
  (tmp_path / "translations/mcd1").mkdir(parents=True)
  (tmp_path / "translations/mcd1/test.en.sparql").write_text("\n".join([gold] * 3) + "\n")
  (tmp_path / "results/tiny").mkdir(parents=True)
  (tmp_path / "results/tiny/predictions_mcd1_en.txt").write_text("\n".join(HOSTILE) + "\n")
  assert report_cli.main([
      str(tmp_path / "results"), "--targets_dir",
      str(tmp_path / "translations"), "--out",
      str(tmp_path / "out"), "--html",
      str(tmp_path / "html")
  ]) == 0
  _open(driver, tmp_path / "html" / browser.PAGE)
  assert _count(driver) == _shown(driver) == 3
  shown = driver.find_element("id", "rows").text
  for prediction in HOSTILE:
    assert prediction in shown, (prediction, shown)
  assert driver.title != "injected"
