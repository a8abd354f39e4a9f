package quota

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/edgelimit/edgelimit/pop/rules"
)

//go:embed migrations/*.sql
var migrations embed.FS

// notifyChannel is the PostgreSQL channel every write notifies, with the
// audit id as payload.
const notifyChannel = "edgelimit_quotas"

// writeLock is the advisory lock every write holds, so that audit ids
// increase in commit order and a PoP that has read up to id N has missed
// nothing below it.
const writeLock = 0x6564676571756f74 // "edgequot"

// changeBatch bounds the audit entries one ChangesSince reads.
const changeBatch = 10000

// Postgres is the quota Store on PostgreSQL, the system of record. It is safe
// for concurrent use.
type Postgres struct {
	pool *pgxpool.Pool
	url  string

	mu       sync.Mutex
	migrated bool
}

// NewPostgres returns the store of the database at url (postgres://…)
// without connecting: a PoP starts while PostgreSQL is down. The first call
// that reaches the database applies the embedded migrations it lacks; when
// it lacks none it only reads, so a PoP's role needs no more than SELECT on
// a database an operator (or a first PoP with CREATE rights) migrated.
func NewPostgres(url string) (*Postgres, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("quota: postgres URL: %w", err)
	}
	cfg.MaxConns = max(cfg.MaxConns, 4)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("quota: postgres: %w", err)
	}
	return &Postgres{pool: pool, url: url}, nil
}

// OpenPostgres is NewPostgres, then the migrations at once: applying them is
// idempotent and safe when several PoPs start together.
func OpenPostgres(ctx context.Context, url string) (*Postgres, error) {
	p, err := NewPostgres(url)
	if err != nil {
		return nil, err
	}
	if err := p.ensure(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// ensure applies the migrations once.
func (p *Postgres) ensure(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.migrated {
		return nil
	}
	if err := p.migrate(ctx); err != nil {
		return err
	}
	p.migrated = true
	return nil
}

// Close closes the connections.
func (p *Postgres) Close() { p.pool.Close() }

func (p *Postgres) migrate(ctx context.Context) error {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return err
	}
	slices.Sort(names)
	if ok, err := p.current(ctx, names); err == nil && ok {
		return nil
	}
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(writeLock)); err != nil {
			return fmt.Errorf("quota: migrations: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS quota_migrations (name TEXT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT NOW())`); err != nil {
			return fmt.Errorf("quota: migrations: %w", err)
		}
		for _, n := range names {
			var done bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM quota_migrations WHERE name = $1)`, n).Scan(&done); err != nil {
				return fmt.Errorf("quota: migration %s: %w", n, err)
			}
			if done {
				continue
			}
			sql, err := migrations.ReadFile(n)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, string(sql)); err != nil {
				return fmt.Errorf("quota: migration %s: %w", n, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO quota_migrations (name) VALUES ($1)`, n); err != nil {
				return fmt.Errorf("quota: migration %s: %w", n, err)
			}
		}
		return nil
	})
}

// current reports whether the database has every migration of names
// applied, with reads only: a PoP whose role may only read (no CREATE on the
// schema, no write to quota_migrations) starts on a database an operator
// migrated. An error (the table is not readable) leaves the answer to
// migrate's own attempt, which then names what failed.
func (p *Postgres) current(ctx context.Context, names []string) (bool, error) {
	var table *string
	if err := p.pool.QueryRow(ctx, `SELECT to_regclass('quota_migrations')::text`).Scan(&table); err != nil || table == nil {
		return false, err
	}
	rows, err := p.pool.Query(ctx, `SELECT name FROM quota_migrations`)
	if err != nil {
		return false, err
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return false, err
	}
	for _, n := range names {
		if !slices.Contains(applied, n) {
			return false, nil
		}
	}
	return true, nil
}

// selectRows reads quota rows with NULL numbers and units as zero values,
// so that scanning a million rows allocates only the strings it keeps.
const selectRows = `SELECT api_key, descriptor, tier, COALESCE(requests_per_unit, 0), COALESCE(unit, ''),
	effective_at, expires_at, updated_at FROM quota_overrides`

// interner shares the copies of strings that repeat across quotas (tiers,
// limit names).
type interner map[string]string

func (in interner) get(b []byte) string {
	if s, ok := in[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(in) < 1<<16 {
		in[s] = s
	}
	return s
}

// scanQuotas reads rows of selectRows, ordered by api_key, into quotas: a
// key's rows are adjacent, its own row (the empty descriptor) first.
func scanQuotas(rows pgx.Rows) ([]*Quota, error) {
	var out []*Quota
	err := scanRows(rows, func(key []byte) *Quota {
		q := &Quota{APIKey: string(key)}
		out = append(out, q)
		return q
	})
	return out, err
}

// scanTable reads rows of selectRows, in any order, into a table (sized
// for about n keys, growing past that) and its plans, hashing keys with
// seed: the index is built in the same pass that reads the rows. A key's
// rows need not be adjacent; when they are (PostgreSQL returns a seq scan in
// the order rows were written, and a write inserts a key's rows together)
// the key is looked up once for all of them.
func scanTable(rows pgx.Rows, seed maphash.Seed, n int) (table, plans, error) {
	t := newTable(n, 16*n)
	var ps plans
	var cur Quota // the run of rows of key being read
	var key []byte
	// add puts the run read last in t. A run without the key's own row
	// (the empty descriptor) has no UpdatedAt (the column is NOT NULL).
	add := func() {
		if key == nil {
			return
		}
		h := maphash.Bytes(seed, key)
		sl := t.findBytes(h, key)
		if sl == nil {
			set(&t, h, key, &cur, ps.id(cur.Tier, cur.Overrides))
			return
		}
		// A key whose rows were not adjacent: rare.
		p := ps.list[sl.plan]
		merged := Quota{Tier: p.Tier, Overrides: append(append([]Override(nil), p.Overrides...), cur.Overrides...)}
		merged.EffectiveAt, merged.ExpiresAt = t.times(sl.rec)
		merged.UpdatedAt = t.updated(sl.rec)
		if cur.UpdatedAt != 0 {
			merged.Tier, merged.EffectiveAt, merged.ExpiresAt, merged.UpdatedAt = cur.Tier, cur.EffectiveAt, cur.ExpiresAt, cur.UpdatedAt
		}
		sl.plan = ps.id(merged.Tier, merged.Overrides)
		t.setTimes(sl, &merged)
	}
	err := scanRows(rows, func(k []byte) *Quota {
		add()
		key, cur = append(key[:0], k...), Quota{}
		return &cur
	})
	add()
	return t, ps, err
}

// scanRows decodes rows of selectRows; quota returns the quota a row of key
// belongs to, called once per run of rows of one key. Overrides are carved
// from slabs, repeated names interned, and rows read without a copy per
// column, so that a million rows make thousands of allocations, not
// millions, and the garbage collector has little to do while they load.
func scanRows(rows pgx.Rows, quota func(key []byte) *Quota) error {
	defer rows.Close()
	in := interner{}
	var (
		a             slabs
		cur           *Quota
		curKey        []byte     // cur's key
		pending       []Override // cur's, until its run of rows ends
		rpu           int32
		eff, exp, upd pgtype.Timestamptz
		plans         [8]pgtype.ScanPlan
	)
	// The text columns are read from the row's raw bytes (the same in
	// PostgreSQL's text and binary formats), which Scan would copy into a
	// new slice per column per row; the others through pgx's own decoders,
	// planned once for the query rather than on every row.
	fields := rows.FieldDescriptions()
	if len(fields) != len(plans) {
		return fmt.Errorf("quota: %d columns, want %d", len(fields), len(plans))
	}
	dst := [8]any{nil, nil, nil, &rpu, nil, &eff, &exp, &upd}
	m := rows.Conn().TypeMap()
	for i, f := range fields {
		if dst[i] != nil {
			plans[i] = m.PlanScan(f.DataTypeOID, f.Format, dst[i])
		}
	}
	flush := func() {
		switch {
		case cur == nil || len(pending) == 0:
		case len(cur.Overrides) == 0:
			cur.Overrides = a.overridesOf(pending)
		default: // a key whose rows were not adjacent: rare
			cur.Overrides = a.overridesOf(append(slices.Clip(cur.Overrides), pending...))
		}
		pending = pending[:0]
	}
	for rows.Next() {
		raw := rows.RawValues()
		for i, p := range plans {
			if p == nil {
				continue
			}
			if err := p.Scan(raw[i], dst[i]); err != nil {
				return fmt.Errorf("quota: column %s: %w", fields[i].Name, err)
			}
		}
		key, desc, tier, unit := raw[0], raw[1], raw[2], raw[4]
		if cur == nil || string(curKey) != string(key) { // no allocation: a comparison
			flush()
			curKey = append(curKey[:0], key...)
			cur = quota(key)
		}
		if len(desc) == 0 {
			cur.Tier, cur.UpdatedAt = in.get(tier), pgTime(upd)
			cur.EffectiveAt, cur.ExpiresAt = pgTime(eff), pgTime(exp)
			continue
		}
		u, err := rules.ParseUnit(in.get(unit)) // interned: no copy per row
		if err != nil {
			return fmt.Errorf("quota: row (%q, %q): %w", key, desc, err)
		}
		pending = append(pending, Override{Descriptor: in.get(desc), RequestsPerUnit: int64(rpu), Unit: u})
	}
	if err := rows.Err(); err != nil {
		return err
	}
	flush()
	return nil
}

// slabs hands out quotas, overrides and strings carved from larger
// allocations: fewer objects to allocate when many quotas are read at once
// (a store's snapshot, a snapshot file read whole). An Index holds none of
// them: it copies what it keeps into its own pointer-free arrays. A slab
// lives as long as any quota carved from it.
type slabs struct {
	quotas    []Quota
	overrides []Override
	bytes     strings.Builder
}

const slabLen = 4096

func (a *slabs) quota() *Quota {
	if len(a.quotas) == 0 {
		a.quotas = make([]Quota, slabLen)
	}
	q := &a.quotas[0]
	a.quotas = a.quotas[1:]
	return q
}

// overrides returns a copy of os carved from the current override slab,
// its capacity kept at its length, so that an append elsewhere copies
// instead of writing over the next key's overrides.
func (a *slabs) overridesOf(os []Override) []Override {
	if len(os) == 0 {
		return nil
	}
	if len(a.overrides) < len(os) {
		a.overrides = make([]Override, max(slabLen, len(os)))
	}
	out := a.overrides[:len(os):len(os)]
	copy(out, os)
	a.overrides = a.overrides[len(os):]
	return out
}

// str returns b as a string carved from the current byte slab: a Builder
// never changes bytes it has handed out, and a new one starts when the slab
// is full.
func (a *slabs) str(b []byte) string {
	if a.bytes.Cap()-a.bytes.Len() < len(b) {
		a.bytes = strings.Builder{}
		a.bytes.Grow(max(64<<10, len(b)))
	}
	start := a.bytes.Len()
	a.bytes.Write(b)
	return a.bytes.String()[start:]
}

func pgTime(t pgtype.Timestamptz) Time {
	if !t.Valid {
		return 0
	}
	return TimeOf(t.Time)
}

func getTx(ctx context.Context, tx pgx.Tx, key string, lock bool) (*Quota, error) {
	q := selectRows + ` WHERE api_key = $1 ORDER BY descriptor`
	if lock {
		q += ` FOR UPDATE`
	}
	rows, err := tx.Query(ctx, q, key)
	if err != nil {
		return nil, err
	}
	qs, err := scanQuotas(rows)
	if err != nil || len(qs) == 0 {
		return nil, err
	}
	return qs[0], nil
}

// Get returns key's quota, or ErrNotFound.
func (p *Postgres) Get(ctx context.Context, key string) (*Quota, error) {
	if err := p.ensure(ctx); err != nil {
		return nil, err
	}
	rows, err := p.pool.Query(ctx, selectRows+` WHERE api_key = $1 ORDER BY descriptor`, key)
	if err != nil {
		return nil, fmt.Errorf("quota: get: %w", err)
	}
	qs, err := scanQuotas(rows)
	if err != nil {
		return nil, fmt.Errorf("quota: get: %w", err)
	}
	if len(qs) == 0 {
		return nil, ErrNotFound
	}
	return qs[0], nil
}

// write runs one audited change of key: fn changes the rows, then the audit
// entry is appended and the change notified, in one transaction.
func (p *Postgres) write(ctx context.Context, key, actor string, fn func(tx pgx.Tx, before *Quota) (*Quota, error)) (before *Quota, err error) {
	if err := p.ensure(ctx); err != nil {
		return nil, err
	}
	err = pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(writeLock)); err != nil {
			return err
		}
		b, err := getTx(ctx, tx, key, true)
		if err != nil {
			return err
		}
		before = b
		after, err := fn(tx, b)
		if err != nil {
			return err
		}
		bj, aj := jsonOrNil(b), jsonOrNil(after)
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO quota_audit (api_key, actor, before, after) VALUES ($1, $2, $3, $4) RETURNING id`,
			key, actor, bj, aj).Scan(&id); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `SELECT pg_notify($1, $2)`, notifyChannel, strconv.FormatInt(id, 10))
		return err
	})
	return before, err
}

func jsonOrNil(q *Quota) []byte {
	if q == nil {
		return nil
	}
	b, _ := json.Marshal(q.ToWire())
	return b
}

// Put creates or replaces q on behalf of actor.
func (p *Postgres) Put(ctx context.Context, q *Quota, actor string) (*Quota, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	before, err := p.write(ctx, q.APIKey, actor, func(tx pgx.Tx, before *Quota) (*Quota, error) {
		if _, err := tx.Exec(ctx, `DELETE FROM quota_overrides WHERE api_key = $1`, q.APIKey); err != nil {
			return nil, err
		}
		eff, exp := nullTime(q.EffectiveAt.Time()), nullTime(q.ExpiresAt.Time())
		var upd time.Time
		if err := tx.QueryRow(ctx, `INSERT INTO quota_overrides (api_key, descriptor, tier, effective_at, expires_at) VALUES ($1, '', $2, $3, $4) RETURNING updated_at`,
			q.APIKey, q.Tier, eff, exp).Scan(&upd); err != nil {
			return nil, err
		}
		q.UpdatedAt = TimeOf(upd)
		for _, o := range q.Overrides {
			if _, err := tx.Exec(ctx, `INSERT INTO quota_overrides (api_key, descriptor, tier, requests_per_unit, unit, effective_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
				q.APIKey, o.Descriptor, q.Tier, o.RequestsPerUnit, o.Unit.String(), eff, exp); err != nil {
				return nil, err
			}
		}
		return q, nil
	})
	if err != nil {
		return nil, fmt.Errorf("quota: put %q: %w", q.APIKey, err)
	}
	q.Prepare()
	return before, nil
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// Delete removes key's quota on behalf of actor.
func (p *Postgres) Delete(ctx context.Context, key, actor string) (*Quota, error) {
	before, err := p.write(ctx, key, actor, func(tx pgx.Tx, before *Quota) (*Quota, error) {
		if before == nil {
			return nil, ErrNotFound
		}
		_, err := tx.Exec(ctx, `DELETE FROM quota_overrides WHERE api_key = $1`, key)
		return nil, err
	})
	if errors.Is(err, ErrNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("quota: delete %q: %w", key, err)
	}
	return before, nil
}

// List returns up to limit quotas of tier ("" for all) after key after.
func (p *Postgres) List(ctx context.Context, tier, after string, limit int) ([]*Quota, error) {
	if err := p.ensure(ctx); err != nil {
		return nil, err
	}
	rows, err := p.pool.Query(ctx, selectRows+` WHERE api_key IN (
		SELECT api_key FROM quota_overrides WHERE descriptor = '' AND ($1 = '' OR tier = $1) AND api_key > $2 ORDER BY api_key LIMIT $3)
		ORDER BY api_key, descriptor`, tier, after, limit)
	if err != nil {
		return nil, fmt.Errorf("quota: list: %w", err)
	}
	qs, err := scanQuotas(rows)
	if err != nil {
		return nil, fmt.Errorf("quota: list: %w", err)
	}
	return qs, nil
}

// Audit returns key's audit entries, newest first.
func (p *Postgres) Audit(ctx context.Context, key string, limit int) ([]AuditEntry, error) {
	if err := p.ensure(ctx); err != nil {
		return nil, err
	}
	rows, err := p.pool.Query(ctx, `SELECT id, api_key, actor, at, before, after FROM quota_audit WHERE api_key = $1 ORDER BY id DESC LIMIT $2`, key, limit)
	if err != nil {
		return nil, fmt.Errorf("quota: audit: %w", err)
	}
	defer rows.Close()
	var out []AuditEntry
	for rows.Next() {
		var e AuditEntry
		if err := rows.Scan(&e.ID, &e.APIKey, &e.Actor, &e.At, &e.Before, &e.After); err != nil {
			return nil, fmt.Errorf("quota: audit: %w", err)
		}
		e.At = e.At.UTC()
		out = append(out, e)
	}
	return out, rows.Err()
}

// readOnly runs fn in a repeatable-read, read-only transaction: one
// consistent view of the audit log and the quotas.
func (p *Postgres) readOnly(ctx context.Context, fn func(pgx.Tx) error) error {
	if err := p.ensure(ctx); err != nil {
		return err
	}
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Snapshot returns every quota and the last audit id it reflects.
func (p *Postgres) Snapshot(ctx context.Context) ([]*Quota, int64, error) {
	t, ps, v, err := p.snapshotTable(ctx, maphash.MakeSeed())
	if err != nil {
		return nil, 0, err
	}
	return (&snapshot{base: t, plans: ps.list}).all(), v, nil
}

// snapshotTable is Snapshot as the table of an Index hashing with seed,
// built as the rows arrive (the Syncer's load).
func (p *Postgres) snapshotTable(ctx context.Context, seed maphash.Seed) (table, plans, int64, error) {
	var t table
	var ps plans
	var version int64
	err := p.readOnly(ctx, func(tx pgx.Tx) error {
		var n int
		if err := tx.QueryRow(ctx, `SELECT (SELECT COALESCE(MAX(id), 0) FROM quota_audit), (SELECT COUNT(*) FROM quota_overrides WHERE descriptor = '')`).Scan(&version, &n); err != nil {
			return err
		}
		// In the table's order (a seq scan), not the key's: ordering by key
		// cost PostgreSQL twice the time (an index scan), and the table
		// being built finds a key's rows wherever they are.
		rows, err := tx.Query(ctx, selectRows)
		if err != nil {
			return err
		}
		t, ps, err = scanTable(rows, seed, n)
		return err
	})
	if err != nil {
		return table{}, plans{}, 0, fmt.Errorf("quota: snapshot: %w", err)
	}
	return t, ps, version, nil
}

// ChangesSince returns the keys written after version, with their state now.
func (p *Postgres) ChangesSince(ctx context.Context, version int64) ([]Change, int64, error) {
	var changes []Change
	to := version
	err := p.readOnly(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, api_key FROM quota_audit WHERE id > $1 ORDER BY id LIMIT $2`, version, changeBatch)
		if err != nil {
			return err
		}
		var keys []string
		seen := map[string]bool{}
		for rows.Next() {
			var id int64
			var key string
			if err := rows.Scan(&id, &key); err != nil {
				rows.Close()
				return err
			}
			to = max(to, id)
			if !seen[key] {
				seen[key] = true
				keys = append(keys, key)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(keys) == 0 {
			return err
		}
		rows, err = tx.Query(ctx, selectRows+` WHERE api_key = ANY($1) ORDER BY api_key, descriptor`, keys)
		if err != nil {
			return err
		}
		qs, err := scanQuotas(rows)
		if err != nil {
			return err
		}
		byKey := make(map[string]*Quota, len(qs))
		for _, q := range qs {
			byKey[q.APIKey] = q
		}
		for _, k := range keys {
			changes = append(changes, Change{APIKey: k, Quota: byKey[k]})
		}
		return nil
	})
	if err != nil {
		return nil, version, fmt.Errorf("quota: changes: %w", err)
	}
	return changes, to, nil
}

// Watch listens on the notification channel and calls changed on every
// notification until ctx ends or the connection fails.
func (p *Postgres) Watch(ctx context.Context, changed func()) error {
	conn, err := pgx.Connect(ctx, p.url)
	if err != nil {
		return fmt.Errorf("quota: listen: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return fmt.Errorf("quota: listen: %w", err)
	}
	changed() // anything written while no one listened
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("quota: listen: %w", err)
		}
		changed()
	}
}

// RedactURL is url without its password, for logs.
func RedactURL(url string) string {
	cfg, err := pgx.ParseConfig(url)
	if err != nil || cfg.Password == "" {
		return url
	}
	return strings.Replace(url, ":"+cfg.Password+"@", ":xxxxx@", 1)
}
