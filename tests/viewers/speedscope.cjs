// Checks a speedscope file the way a user meets it: against the JSON schema speedscope publishes
// (dist/release/file-format-schema.json of its npm package, draft-07, with Ajv), then opened in
// speedscope itself (the npm package's offline build) in headless Chromium, through its file
// input, with its sandwich view read back row by row.
//
// Usage: node speedscope.cjs NODE_MODULES PROFILE.json [SCREENSHOT.png]
// Prints one JSON object: {schemaErrors, consoleErrors, requests, rows: [{name, file, total, self}]}.

const path = require('path');
const fs = require('fs');

const [modules, profile, screenshot] = process.argv.slice(2);
const { withPage } = require('./chromium.cjs');
const Ajv = require(path.join(modules, 'ajv'));
const release = path.join(modules, 'speedscope', 'dist', 'release');

function schemaErrors() {
  const schema = JSON.parse(fs.readFileSync(path.join(release, 'file-format-schema.json'), 'utf8'));
  const validate = new Ajv({ allErrors: true, strict: false }).compile(schema);
  const valid = validate(JSON.parse(fs.readFileSync(profile, 'utf8')));
  return valid ? [] : validate.errors.map((e) => `${e.instancePath} ${e.message}`);
}

/** A sandwich cell, "421 (47%)": its weight. */
function weight(cell) {
  return Number(cell.trim().split(' ')[0]);
}

// Tall enough that the sandwich table renders every row (it draws only those in view).
const result = { schemaErrors: schemaErrors(), rows: [] };
withPage(modules, { width: 1600, height: 8000 }, result, (url) => url.startsWith('file:'), async (page) => {
  await page.goto('file://' + path.join(release, 'index.html'));
  await page.setInputFiles('input[type=file]', profile);
  await page.getByText('Sandwich').click();
  await page.waitForSelector('td[title]', { timeout: 30000 });
  const cells = await page.$$eval('tr', (rows) =>
    rows
      .map((row) => Array.from(row.querySelectorAll('td')))
      .filter((cells) => cells.length === 3)
      .map((cells) => [cells[0].innerText, cells[1].innerText, cells[2].innerText, cells[2].title]),
  );
  result.rows = cells.map(([total, self, name, file]) => ({
    name: name.trim(),
    file,
    total: weight(total),
    self: weight(self),
  }));
  // After the rows: back at the tall size the table redraws only on its next frame, and rows
  // read then were those of the short screen (a run with over 45 functions lost some).
  if (screenshot) {
    await page.setViewportSize({ width: 1600, height: 900 });
    await page.screenshot({ path: screenshot });
  }
});
