// Headless Chromium (Debian's, through playwright-core) as the viewer scripts use it: one page,
// every request that leaves the files it is allowed and every console error and page error
// recorded in `result`, the result printed as one JSON line when `use` is done, and any failure
// an exit status of 1.

const path = require('path');

/**
 * Opens a page of `viewport` size, calls `use(page)`, closes the browser and prints `result`
 * (given `consoleErrors` and `requests`). `local(url)` says which requests stay on the machine.
 */
function withPage(modules, viewport, result, local, use) {
  const { chromium } = require(path.join(modules, 'playwright-core'));
  Object.assign(result, { consoleErrors: [], requests: [] });
  const run = async () => {
    const browser = await chromium.launch({
      executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
      args: ['--no-sandbox'],
    });
    try {
      const page = await browser.newPage({ viewport });
      page.on('request', (request) => {
        if (!local(request.url())) result.requests.push(request.url());
      });
      page.on('console', (message) => {
        if (message.type() === 'error') result.consoleErrors.push(message.text());
      });
      page.on('pageerror', (error) => result.consoleErrors.push(error.message));
      await use(page);
    } finally {
      await browser.close();
    }
    process.stdout.write(JSON.stringify(result) + '\n');
  };
  run().catch((error) => {
    console.error(error);
    process.exit(1);
  });
}

module.exports = { withPage };
