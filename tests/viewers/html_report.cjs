// Opens a `--html` report the way a user meets it, in headless Chromium from the file itself,
// and reads back what its views show: the frames drawn, a search's matches, a function's
// callers, callees, source lines and instructions after a click on its widest frame, the flame
// graph's roots in view, and the differential view against the report's baseline.
//
// Usage: node html_report.cjs NODE_MODULES REPORT.html EVENT SEARCH FUNCTION [SCREENSHOT_DIR]
// (EVENT: the event's name, or '' for the first)
// Prints one JSON object: {consoleErrors, requests, frames, search, function, flame, diff}.

const path = require('path');

const [modules, report, event, search, wanted, screenshots] = process.argv.slice(2);
const { withPage } = require('./chromium.cjs');

async function shot(page, name) {
  if (screenshots) await page.screenshot({ path: path.join(screenshots, name), fullPage: false });
}

/** The frames drawn: name, share of the graph's width, and the differential value if any. */
function drawn(page) {
  return page.$$eval('.frame', (frames) => frames.map((frame) => ({
    name: frame.dataset.name,
    width: parseFloat(frame.style.width),
    match: frame.classList.contains('match'),
    diff: frame.dataset.diff === undefined ? null : Number(frame.dataset.diff),
    title: frame.title,
  })));
}

// Nothing but the file itself may be asked for.
const result = {};
withPage(modules, { width: 1400, height: 900 }, result, (url) => url === 'file://' + report, async (page) => {
  await page.goto('file://' + report);
  await page.waitForSelector('.frame');
  if (event) {
    const index = await page.$$eval('#event option', (options, name) =>
      options.find((o) => o.textContent === name)?.value, event);
    await page.selectOption('#event', index);
  }
  result.events = await page.$$eval('#event option', (options) => options.map((o) => o.textContent));
  result.compare = await page.$eval('#compare', (select) => select.value);
  // The first view, before anything is clicked: whatever is compared is compared.
  result.diff = result.compare ? await drawn(page) : null;
  if (result.compare) await shot(page, 'differential.png');
  await page.selectOption('#compare', '');
  result.frames = await drawn(page);

  await page.fill('#search', search);
  result.search = {
    matched: Number(await page.$eval('#status', (status) => status.dataset.matched)),
    status: await page.textContent('#status'),
    frames: (await drawn(page)).filter((frame) => frame.match).map((frame) => frame.name),
  };
  await page.fill('#search', '');

  const widest = (await drawn(page))
    .filter((frame) => frame.name === wanted)
    .sort((a, b) => b.width - a.width)[0];
  if (widest) {
    const frames = await page.$$(`.frame`);
    for (const frame of frames) {
      const name = await frame.getAttribute('data-name');
      const width = parseFloat(await frame.evaluate((f) => f.style.width));
      if (name === wanted && width === widest.width) { await frame.click(); break; }
    }
    const rows = (selector) => page.$$eval(selector, (trs) => trs.map((tr) =>
      Array.from(tr.querySelectorAll('td')).map((td) => td.textContent.trim())));
    result.function = {
      name: await page.textContent('#fn-name'),
      summary: await page.textContent('#fn-summary'),
      callers: await rows('#callers tr.clickable'),
      callees: await rows('#callees tr.clickable'),
      statements: await rows('#source tr.stmt'),
      instructions: await rows('#source tr.insn'),
      note: await page.textContent('#details-note'),
      blocks: await rows('#blocks tr.bucket'),
      zoomedTo: await page.textContent('#status'),
    };
    await shot(page, 'function.png');
    await page.$eval('#details', (details) => details.scrollIntoView());
    await shot(page, 'function-details.png');
    await page.$eval('#graph', (graph) => graph.scrollIntoView());
  }

  await page.click('#reset');
  await page.selectOption('#view', 'flame');
  // Deep stacks open where the samples are: the roots, at the bottom, in view.
  result.flame = await page.evaluate(() => {
    const graph = document.getElementById('graph').getBoundingClientRect();
    const all = [...document.querySelectorAll('.frame')].find((f) => f.dataset.name === 'all');
    const box = all.getBoundingClientRect();
    return { rootInView: box.top >= graph.top && box.bottom <= graph.bottom };
  });
  await shot(page, 'flame-graph.png');
});
