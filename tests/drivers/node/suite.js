// node-postgres through refract (run by crates/refract-dispatch/tests/it/pg_drivers.rs; installed by
// tests/drivers/setup-all.sh with `npm ci`). Usage: node suite.js PORT. Prints `ok NAME` or
// `FAIL NAME: reason` per check, then `done`; exits 1 when a check failed. Every check asserts
// what a direct connection to PostgreSQL gives, and runs under a time limit.
'use strict'
const pg = require('pg')
const { from: copyFrom, to: copyTo } = require('pg-copy-streams')
const { pipeline } = require('stream/promises')
const { Readable, Writable } = require('stream')

const CLIENTS = 20
const BIG = 200 * 1024 * 1024
const NAME = 'node'
const config = {
  host: '127.0.0.1',
  port: Number(process.argv[2]),
  user: 'refract',
  password: 'refract',
  database: 'postgres',
  connectionTimeoutMillis: 10000,
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

function eq(got, want, what) {
  const [g, w] = [JSON.stringify(got), JSON.stringify(want)]
  if (g !== w) throw new Error(`${what}: got ${g}, want ${w}`)
}

async function connect(extra = {}) {
  const c = new pg.Client({ ...config, ...extra })
  c.on('error', () => {})
  await c.connect()
  return c
}

async function withClients(n, fn) {
  const cs = []
  try {
    for (let i = 0; i < n; i++) cs.push(await connect())
    return await fn(...cs)
  } finally {
    await Promise.all(cs.map((c) => c.end().catch(() => {})))
  }
}

// Short statements on the primary (the hint is a comment to PostgreSQL) and on a replica, so
// that a client's statements land on whichever server connection is free.
const CHURN = ['/* refract: route=primary */ SELECT pg_sleep(0.002)', 'SELECT pg_sleep(0.002)']

// Like withClients, with 3 more clients running CHURN meanwhile: session state a client's
// statements rely on must stay with that client.
async function withChurn(n, fn) {
  let stop = false
  const churners = await Promise.all([0, 1, 2].map(() => connect()))
  const loops = churners.map(async (c) => {
    while (!stop) for (const sql of CHURN) await c.query(sql).catch(() => {})
  })
  await sleep(50)
  try {
    return await withClients(n, fn)
  } finally {
    stop = true
    await Promise.all(loops)
    await Promise.all(churners.map((c) => c.end().catch(() => {})))
  }
}

async function one(c, q, values) {
  const r = await c.query(q, values)
  if (!r.rows.length) throw new Error(`${q}: no row`)
  return r.rows[0][r.fields[0].name]
}

async function parallel(n, fn) {
  const results = await Promise.allSettled(Array.from({ length: n }, (_, i) => fn(i)))
  results.forEach((r, i) => {
    if (r.status === 'rejected') throw new Error(`client ${i}: ${r.reason && r.reason.message}`)
  })
}

async function sqlstate(promise) {
  try {
    await promise
    return null
  } catch (e) {
    return e.code
  }
}

const checks = {
  async connect() {
    await withClients(1, async (c) => eq(await one(c, 'SELECT $1::int * 2 AS v', [21]), 42, 'a parameter'))
  },

  // Named statements: every client uses the names drv_q0..2 with texts of its own.
  async prepared_concurrent() {
    await parallel(CLIENTS, (i) =>
      withClients(1, async (c) => {
        for (let r = 0; r < 8; r++) {
          for (let j = 0; j < 3; j++) {
            const res = await c.query({ name: `drv_q${j}`, text: `SELECT $1::int + ${i * 100 + j} AS v`, values: [r] })
            eq(res.rows[0].v, r + i * 100 + j, `statement ${j}, round ${r}`)
          }
          await sleep(2)
        }
      })
    )
  },

  // Unnamed statements: values without a name are Parse("")/Bind/Describe/Execute/Sync.
  async unnamed_statement_concurrent() {
    await parallel(CLIENTS, (i) =>
      withClients(1, async (c) => {
        for (let r = 0; r < 8; r++) {
          const res = await c.query({ text: `SELECT $1::int + ${i * 100} AS v, ${r} AS r`, values: [r] })
          eq([res.rows[0].v, res.rows[0].r], [r + i * 100, r], `round ${r}`)
          await sleep(2)
        }
      })
    )
  },

  async sql_prepare_concurrent() {
    await parallel(CLIENTS, (i) =>
      withClients(1, async (c) => {
        await c.query(`PREPARE drv_q (int) AS SELECT $1 + ${i * 100}`)
        for (let r = 0; r < 4; r++) {
          eq(await one(c, `EXECUTE drv_q (${r})`), r + i * 100, `EXECUTE round ${r}`)
          await sleep(3)
        }
        await c.query('DEALLOCATE drv_q')
        eq(await sqlstate(c.query('EXECUTE drv_q (1)')), '26000', 'EXECUTE after DEALLOCATE')
      })
    )
  },

  async set_simple_concurrent() {
    await parallel(CLIENTS, (i) =>
      withClients(1, async (c) => {
        const before = await one(c, 'SHOW application_name')
        await c.query(`SET application_name = 'drv-${i}'`) // no values: a simple Query
        for (let r = 0; r < 5; r++) {
          eq(await one(c, 'SHOW application_name'), `drv-${i}`, `SHOW, round ${r}`)
          eq(await one(c, 'SELECT current_setting($1)', ['application_name']), `drv-${i}`, 'current_setting')
          await sleep(3)
        }
        await c.query('RESET application_name')
        eq(await one(c, 'SHOW application_name'), before, 'after RESET')
      })
    )
  },

  async set_extended_concurrent() {
    await parallel(CLIENTS, (i) =>
      withClients(1, async (c) => {
        await c.query({ text: `SET work_mem = '${1025 + i}kB'`, queryMode: 'extended' })
        for (let r = 0; r < 5; r++) {
          eq(await one(c, 'SHOW work_mem'), `${1025 + i}kB`, `SHOW, round ${r}`)
          await sleep(3)
        }
      })
    )
  },

  // Startup parameters: `options` (-c name=value) and application_name, each client its own.
  async startup_options_concurrent() {
    await parallel(CLIENTS, async (i) => {
      const c = await connect({ options: `-c work_mem=${2049 + i}kB`, application_name: `drv-start-${i}` })
      try {
        for (let r = 0; r < 5; r++) {
          eq(await one(c, 'SHOW work_mem'), `${2049 + i}kB`, `work_mem, round ${r}`)
          eq(await one(c, 'SELECT current_setting($1)', ['application_name']), `drv-start-${i}`, 'application_name')
          await sleep(3)
        }
      } finally {
        await c.end().catch(() => {})
      }
    })
  },

  async set_config() {
    await withChurn(2, async (a, b) => {
      const def = await one(b, 'SHOW work_mem')
      eq(await one(a, "SELECT set_config('work_mem', $1, false)", ['3333kB']), '3333kB', 'set_config')
      for (let r = 0; r < 8; r++) {
        eq(await one(b, 'SHOW work_mem'), def, "another client's work_mem")
        eq(await one(a, 'SHOW work_mem'), '3333kB', `work_mem after set_config, round ${r}`)
      }
    })
  },

  async temp_table() {
    await withChurn(2, async (a, b) => {
      await a.query('CREATE TEMP TABLE drv_tmp (k int, v text)')
      await a.query('INSERT INTO drv_tmp VALUES ($1, $2)', [1, NAME])
      for (let r = 0; r < 8; r++) {
        await b.query('SELECT 1')
        eq(await one(a, 'SELECT v FROM drv_tmp WHERE k = $1', [1]), NAME, `read back, round ${r}`)
      }
      eq(await sqlstate(b.query('SELECT * FROM drv_tmp')), '42P01', "another client's SELECT of the temp table")
      await b.query('CREATE TEMP TABLE drv_tmp (k int, v text)')
      eq(await one(b, 'SELECT count(*)::int FROM drv_tmp'), 0, "the other client's own temp table")
      eq(await one(a, 'SELECT count(*)::int FROM drv_tmp'), 1, "the first client's temp table")
    })
  },

  async advisory_lock() {
    const key = 4200006
    await withChurn(2, async (a, b) => {
      // try-lock, so that a lock some earlier client left on a pooled connection fails the
      // check instead of blocking it.
      eq(await one(a, 'SELECT pg_try_advisory_lock($1)', [key]), true, 'the holder takes the lock')
      for (let r = 0; r < 8; r++) {
        await a.query('SELECT 1')
        eq(await one(b, 'SELECT pg_try_advisory_lock($1)', [key]), false, `another client takes the lock, round ${r}`)
      }
      eq(await one(a, 'SELECT pg_advisory_unlock($1)', [key]), true, 'the holder unlocks')
      await b.query('SELECT pg_advisory_lock($1)', [key])
      eq(await one(b, 'SELECT pg_advisory_unlock($1)', [key]), true, 'and unlocks it')
    })
  },

  async listen_notify() {
    const chan = `drv_${NAME}`
    await withChurn(3, async (listener, other, sender) => {
      const got = []
      const seenByOther = []
      listener.on('notification', (n) => got.push([n.channel, n.payload]))
      other.on('notification', (n) => seenByOther.push([n.channel, n.payload]))
      await listener.query(`LISTEN ${chan}`)
      await other.query('SELECT 1')
      await sender.query(`NOTIFY ${chan}, 'hello'`)
      await sender.query('SELECT pg_notify($1, $2)', [chan, 'second'])
      for (let t = 0; t < 100 && got.length < 2; t++) await sleep(50)
      eq(got, [[chan, 'hello'], [chan, 'second']], 'notifications of an idle listener')
      for (let r = 0; r < 3; r++) await other.query('SELECT 1')
      eq(seenByOther, [], 'notifications seen by a client that did not LISTEN')
      await listener.query(`UNLISTEN ${chan}`)
      await sender.query(`NOTIFY ${chan}, 'after unlisten'`)
      await sleep(1000)
      eq(got.length, 2, 'notifications after UNLISTEN')
    })
  },

  async copy_in() {
    await withClients(1, async (c) => {
      const table = `drv_copy_${NAME}`
      await c.query(`DROP TABLE IF EXISTS ${table}`)
      await c.query(`CREATE TABLE ${table} (k int, v text)`)
      const lines = Array.from({ length: 20000 }, (_, k) => `${k}\trow ${k}\n`)
      await pipeline(Readable.from([lines.join('')]), c.query(copyFrom(`COPY ${table} (k, v) FROM STDIN`)))
      const r = await c.query(`SELECT count(*)::int AS n, sum(k)::int8::text AS s FROM ${table}`)
      eq([r.rows[0].n, r.rows[0].s], [20000, '199990000'], 'rows copied in')
    })
  },

  async copy_out() {
    await withClients(1, async (c) => {
      const chunks = []
      const sink = new Writable({
        write(chunk, _enc, done) {
          chunks.push(chunk)
          done()
        },
      })
      await pipeline(c.query(copyTo("COPY (SELECT g, 'row ' || g FROM generate_series(0, 19999) g) TO STDOUT")), sink)
      const lines = Buffer.concat(chunks).toString().split('\n').filter((l) => l)
      eq(lines.length, 20000, 'rows copied out')
      eq(lines[12345], '12345\trow 12345', 'row 12345')
    })
  },

  async cancel() {
    await withClients(1, async (c) => {
      const start = Date.now()
      const sleeping = c.query('SELECT pg_sleep(30)')
      const query = c.activeQuery || c.queryQueue[0]
      setTimeout(() => new pg.Client(config).cancel(c, query), 500)
      eq(await sqlstate(sleeping), '57014', 'SQLSTATE of the cancelled statement')
      const took = (Date.now() - start) / 1000
      if (took > 5) throw new Error(`cancelled after ${took} s`)
      eq(await one(c, 'SELECT 1 AS v'), 1, 'the connection after the cancel')
    })
  },

  async result_200mb() {
    await withClients(1, async (c) => {
      const v = await one(c, `SELECT repeat('x', ${BIG}) AS v`)
      eq(v.length, BIG, 'length')
      eq(await one(c, 'SELECT 2 AS v'), 2, 'the connection after')
    })
  },

  async errors() {
    await withClients(1, async (c) => {
      for (const [sql, values, code] of [
        ['SELECT 1/0', undefined, '22012'],
        ['SELECT $1::int / 0', [1], '22012'],
        ['SELEC 1', undefined, '42601'],
        ['SELECT * FROM drv_no_such_table', undefined, '42P01'],
      ]) {
        eq(await sqlstate(c.query(sql, values)), code, sql)
      }
      await c.query('BEGIN')
      await c.query('SAVEPOINT s')
      eq(await sqlstate(c.query('SELECT 1/0')), '22012', 'in a savepoint')
      await c.query('ROLLBACK TO SAVEPOINT s')
      eq(await one(c, 'SELECT 3 AS v'), 3, 'after a failed savepoint')
      await c.query('COMMIT')
    })
  },
}

async function main() {
  const failed = []
  for (const [name, fn] of Object.entries(checks)) {
    const start = Date.now()
    let timer
    try {
      await Promise.race([
        fn(),
        new Promise((_, reject) => {
          timer = setTimeout(() => reject(new Error('timed out after 30 s')), 30000)
        }),
      ])
      console.log(`ok ${name} (${((Date.now() - start) / 1000).toFixed(1)} s)`)
    } catch (e) {
      failed.push(name)
      console.log(`FAIL ${name}: ${String((e && e.message) || e).replace(/\n/g, ' | ')}`)
    } finally {
      clearTimeout(timer)
    }
  }
  if (failed.length) console.log(`failed: ${failed.join(', ')}`)
  console.log('done')
  process.exit(failed.length ? 1 : 0)
}

main()
