// graphile-worker drains N no-op jobs: `node graphile.mjs DATABASE_URL JOBS CONCURRENCY`.
// The jobs are added in one SQL statement (graphile_worker.add_jobs), then one worker process
// of CONCURRENCY runs them; prints one JSON line: {"enqueue_per_second", "jobs_per_second"}.
import { Logger, run, runMigrations } from "graphile-worker";
import pg from "pg";

const [url, jobsArg, concurrencyArg] = process.argv.slice(2);
const jobs = Number(jobsArg);
const concurrency = Number(concurrencyArg);

await runMigrations({ connectionString: url, logger: quiet() });
const client = new pg.Client({ connectionString: url });
await client.connect();
const added = performance.now();
await client.query(
  `SELECT count(*) FROM graphile_worker.add_jobs((
     SELECT array_agg(ROW('noop', json_build_object('n', i), NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec)
     FROM generate_series(1, $1) AS i))`,
  [jobs],
);
const enqueueSeconds = (performance.now() - added) / 1000;
await client.end();

let done = 0;
let finish;
const finished = new Promise((resolve) => (finish = resolve));
const started = performance.now();
console.error("drain started");
const runner = await run({
  connectionString: url,
  concurrency,
  noHandleSignals: true,
  pollInterval: 1000,
  logger: quiet(),
  taskList: {
    noop: async () => {
      done += 1;
      if (done === jobs) finish();
    },
  },
});
await finished;
console.error("drain ended");
const seconds = (performance.now() - started) / 1000;
await runner.stop();
console.log(JSON.stringify({ enqueue_per_second: jobs / enqueueSeconds, jobs_per_second: jobs / seconds, done }));

function quiet() {
  // graphile-worker's logger: errors only.
  return new Logger(() => (level, message) => {
    if (level === "error") console.error(message);
  });
}
