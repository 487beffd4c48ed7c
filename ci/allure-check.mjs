// Open a generated Allure 3 report in headless Chromium and check that the
// error histograms of fa2-verify's property tests are there and render.
//
//   node ci/allure-check.mjs REPORT_DIR [--screenshot FILE] [--chromium PATH] [--max-tests N]
//
// The report is a JavaScript application that fetches its data, so it is
// served over HTTP on 127.0.0.1 (an ephemeral port) for the browser. For each
// test result whose data lists "error histogram: <output>" PNG attachments
// (data/test-results/*.json), the script opens the test's Attachments tab,
// expands every histogram, and waits until each <img> has decoded. It prints
// one JSON object and exits 0 when every test had its histograms rendered,
// 1 otherwise, 2 on bad arguments or a browser that cannot start.
import { createServer } from 'node:http';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { extname, join, resolve, sep } from 'node:path';
import { chromium } from 'playwright-core';

const HISTOGRAM_PREFIX = 'error histogram: ';
const CHROMIUM_FLAGS = [
  '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
  '--disable-component-update', '--disable-sync',
];
const CONTENT_TYPES = {
  '.html': 'text/html', '.js': 'text/javascript', '.json': 'application/json', '.css': 'text/css',
  '.png': 'image/png', '.svg': 'image/svg+xml', '.csv': 'text/csv', '.txt': 'text/plain', '.ico': 'image/x-icon',
};

function usage(message) {
  console.error(`allure-check: ${message}`);
  console.error('usage: node ci/allure-check.mjs REPORT_DIR [--screenshot FILE] [--chromium PATH] [--max-tests N]');
  process.exit(2);
}

function parseArguments(argv) {
  const options = { chromium: process.env.CHROMIUM || '/usr/bin/chromium', screenshot: null, maxTests: 3 };
  const positional = [];
  for (let i = 0; i < argv.length; i += 1) {
    const flag = argv[i];
    if (flag === '--screenshot' || flag === '--chromium' || flag === '--max-tests') {
      if (i + 1 >= argv.length) usage(`${flag} needs a value`);
      const value = argv[(i += 1)];
      if (flag === '--screenshot') options.screenshot = resolve(value);
      if (flag === '--chromium') options.chromium = value;
      if (flag === '--max-tests') options.maxTests = Number.parseInt(value, 10);
    } else if (flag.startsWith('--')) {
      usage(`unknown option ${flag}`);
    } else {
      positional.push(flag);
    }
  }
  if (positional.length !== 1) usage('give exactly one REPORT_DIR');
  if (!(options.maxTests >= 1)) usage('--max-tests must be a positive integer');
  options.report = resolve(positional[0]);
  if (!existsSync(join(options.report, 'index.html'))) usage(`${options.report} has no index.html: run fa2-verify report first`);
  if (!existsSync(options.chromium)) usage(`no Chromium at ${options.chromium}: apt-get install chromium, or pass --chromium PATH`);
  return options;
}

// Test results that carry histogram attachments, from the report's own data files.
function testsWithHistograms(report) {
  const directory = join(report, 'data', 'test-results');
  if (!existsSync(directory)) return [];
  const tests = [];
  for (const file of readdirSync(directory).filter((name) => name.endsWith('.json')).sort()) {
    const result = JSON.parse(readFileSync(join(directory, file), 'utf8'));
    const names = [];
    const visit = (steps) => {
      for (const step of steps || []) {
        if (step.type === 'attachment' && step.link && step.link.name.startsWith(HISTOGRAM_PREFIX)) {
          if (step.link.contentType === 'image/png' && !step.link.missed) names.push(step.link.name);
        }
        visit(step.steps);
      }
    };
    visit(result.steps);
    if (names.length) tests.push({ id: result.id, name: result.name, fullName: result.fullName, histograms: names });
  }
  return tests;
}

function serve(root) {
  const server = createServer((request, response) => {
    const path = decodeURIComponent(new URL(request.url, 'http://127.0.0.1').pathname);
    const file = resolve(join(root, path === '/' ? 'index.html' : path));
    if (!file.startsWith(root + sep) || !existsSync(file) || !statSync(file).isFile()) {
      response.writeHead(404).end();
      return;
    }
    response.writeHead(200, { 'Content-Type': CONTENT_TYPES[extname(file)] || 'application/octet-stream' });
    response.end(readFileSync(file));
  });
  return new Promise((done) => server.listen(0, '127.0.0.1', () => done(server)));
}

async function checkTest(page, base, test) {
  await page.goto(`${base}/index.html#/${test.id}/attachments`);
  const rendered = [];
  for (const name of test.histograms) {
    const row = page.getByText(name, { exact: true }).first();
    await row.waitFor({ timeout: 30000 });
    const before = await page.locator('img').count();
    await row.click();
    await page.waitForFunction((count) => {
      const images = [...document.querySelectorAll('img')];
      return images.length > count && images.slice(count).every((image) => image.complete && image.naturalWidth > 0);
    }, before, { timeout: 30000 });
    const size = await page.locator('img').nth(before).evaluate((image) => [image.naturalWidth, image.naturalHeight]);
    rendered.push({ name, width: size[0], height: size[1] });
  }
  return rendered;
}

async function main() {
  const options = parseArguments(process.argv.slice(2));
  const tests = testsWithHistograms(options.report);
  const summary = { report: options.report, testsWithHistograms: tests.length, checked: [], screenshot: null };
  if (!tests.length) {
    summary.error = `no test result in ${options.report} has "${HISTOGRAM_PREFIX}<output>" PNG attachments`;
    console.log(JSON.stringify(summary, null, 1));
    process.exit(1);
  }
  const server = await serve(options.report);
  const base = `http://127.0.0.1:${server.address().port}`;
  let browser;
  try {
    browser = await chromium.launch({ executablePath: options.chromium, args: CHROMIUM_FLAGS });
  } catch (error) {
    server.close();
    usage(`Chromium did not start: ${error.message.split('\n')[0]}`);
  }
  let failed = false;
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    for (const test of tests.slice(0, options.maxTests)) {
      try {
        summary.checked.push({ ...test, rendered: await checkTest(page, base, test) });
      } catch (error) {
        failed = true;
        summary.checked.push({ ...test, rendered: [], error: error.message.split('\n')[0] });
      }
    }
    if (options.screenshot && !failed) {
      const shot = await browser.newPage({ viewport: { width: 1280, height: 1200 } });
      const first = tests[0];
      await shot.goto(`${base}/index.html#/${first.id}/attachments`);
      const shown = first.histograms.slice(0, 2);
      for (const name of shown) {
        await shot.getByText(name, { exact: true }).first().click();
      }
      await shot.waitForFunction((count) => {
        const images = [...document.querySelectorAll('img')];
        return images.length >= count && images.every((image) => image.complete && image.naturalWidth > 0);
      }, shown.length, { timeout: 30000 });
      await shot.screenshot({ path: options.screenshot });
      summary.screenshot = options.screenshot;
    }
  } finally {
    await browser.close();
    server.close();
  }
  console.log(JSON.stringify(summary, null, 1));
  process.exit(failed ? 1 : 0);
}

await main();
