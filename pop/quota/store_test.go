package quota_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/edgelimit/edgelimit/pop/quota"
	"github.com/edgelimit/edgelimit/pop/quota/pgtest"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// stores opens every Store implementation, each fresh.
func stores(t *testing.T) map[string]func(t *testing.T) quota.Store {
	return map[string]func(t *testing.T) quota.Store{
		"postgres": func(t *testing.T) quota.Store { return pgtest.Store(t) },
		"file": func(t *testing.T) quota.Store {
			f, err := quota.OpenFile(filepath.Join(t.TempDir(), "quotas"))
			if err != nil {
				t.Fatal(err)
			}
			return f
		},
	}
}

func mkQuota(key, tier string, overrides ...quota.Override) *quota.Quota {
	return (&quota.Quota{APIKey: key, Tier: tier, Overrides: overrides}).Prepare()
}

// TestStoreContract runs one table of behaviour against every store, so
// that PostgreSQL and the embedded file cannot drift apart.
func TestStoreContract(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			if _, err := st.Get(ctx, "nobody"); !errors.Is(err, quota.ErrNotFound) {
				t.Fatalf("Get of a missing key: %v, want ErrNotFound", err)
			}
			if _, err := st.Delete(ctx, "nobody", "test"); !errors.Is(err, quota.ErrNotFound) {
				t.Fatalf("Delete of a missing key: %v, want ErrNotFound", err)
			}
			_, v0, err := st.Snapshot(ctx)
			if err != nil {
				t.Fatal(err)
			}
			eff := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
			q := mkQuota("abc123", "enterprise", quota.Override{Descriptor: "api_key.endpoint=POST /api/v1/orders", RequestsPerUnit: 500, Unit: rules.Minute})
			q.EffectiveAt = quota.TimeOf(eff)
			before, err := st.Put(ctx, q, "alice")
			if err != nil || before != nil {
				t.Fatalf("first Put: before %v, err %v", before, err)
			}
			got, err := st.Get(ctx, "abc123")
			if err != nil {
				t.Fatal(err)
			}
			if got.Tier != "enterprise" || len(got.Overrides) != 1 || got.Overrides[0].RequestsPerUnit != 500 || got.Overrides[0].Unit != rules.Minute ||
				!got.EffectiveAt.Time().Equal(eff) || !got.ExpiresAt.IsZero() || got.UpdatedAt.IsZero() {
				t.Fatalf("Get = %+v", got.ToWire())
			}
			// Replacing: the before is the first quota; overrides not
			// named again are gone.
			before, err = st.Put(ctx, mkQuota("abc123", "pro"), "bob")
			if err != nil || before == nil || before.Tier != "enterprise" {
				t.Fatalf("second Put: before %+v, err %v", before.ToWire(), err)
			}
			if got, _ := st.Get(ctx, "abc123"); got.Tier != "pro" || len(got.Overrides) != 0 {
				t.Fatalf("after replace: %+v", got.ToWire())
			}
			for i := range 5 {
				if _, err := st.Put(ctx, mkQuota(fmt.Sprintf("k%02d", i), []string{"free", "pro"}[i%2]), "carol"); err != nil {
					t.Fatal(err)
				}
			}
			// Paging by tier: pro keys are abc123, k01, k03.
			page1, err := st.List(ctx, "pro", "", 2)
			if err != nil {
				t.Fatal(err)
			}
			page2, err := st.List(ctx, "pro", page1[len(page1)-1].APIKey, 2)
			if err != nil {
				t.Fatal(err)
			}
			if keys(page1) != "abc123,k01" || keys(page2) != "k03" {
				t.Fatalf("pages %s | %s, want abc123,k01 | k03", keys(page1), keys(page2))
			}
			if all, _ := st.List(ctx, "", "", 100); len(all) != 6 {
				t.Fatalf("List all: %d quotas, want 6", len(all))
			}
			if _, err := st.Delete(ctx, "k00", "dave"); err != nil {
				t.Fatal(err)
			}
			// The audit trail: who, before and after, newest first.
			es, err := st.Audit(ctx, "abc123", 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(es) != 2 || es[0].Actor != "bob" || es[1].Actor != "alice" || es[1].Before != nil || es[1].After.Tier != "enterprise" ||
				es[0].Before.Tier != "enterprise" || es[0].After.Tier != "pro" || es[0].At.IsZero() {
				t.Fatalf("audit of abc123: %+v", es)
			}
			if es, _ := st.Audit(ctx, "k00", 10); len(es) != 2 || es[0].After != nil || es[0].Actor != "dave" {
				t.Fatalf("audit of the deleted k00: %+v", es)
			}
			// The change log: every key written since v0, k00 as deleted.
			changes, v, err := st.ChangesSince(ctx, v0)
			if err != nil {
				t.Fatal(err)
			}
			if v != v0+8 {
				t.Fatalf("version %d after 8 writes from %d", v, v0)
			}
			state := map[string]*quota.Quota{}
			for _, c := range changes {
				state[c.APIKey] = c.Quota
			}
			if len(state) != 6 || state["k00"] != nil || state["abc123"].Tier != "pro" {
				t.Fatalf("changes: %v", state)
			}
			if cs, v2, err := st.ChangesSince(ctx, v); err != nil || len(cs) != 0 || v2 != v {
				t.Fatalf("changes since the last version: %v, %d, %v", cs, v2, err)
			}
			all, sv, err := st.Snapshot(ctx)
			if err != nil || sv != v || len(all) != 5 {
				t.Fatalf("snapshot: %d quotas at %d (%v), want 5 at %d", len(all), sv, err, v)
			}
		})
	}
}

func keys(qs []*quota.Quota) string {
	var ks []string
	for _, q := range qs {
		ks = append(ks, q.APIKey)
	}
	return strings.Join(ks, ",")
}

// The audit table refuses updates and deletes, and migrations run again
// without harm (a second PoP starting on the same database).
func TestPostgresAuditAppendOnlyAndMigrationsIdempotent(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Database(t)
	p, err := quota.OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Put(ctx, mkQuota("k", "pro"), "t"); err != nil {
		t.Fatal(err)
	}
	p2, err := quota.OpenPostgres(ctx, url)
	if err != nil {
		t.Fatalf("second open (migrations again): %v", err)
	}
	p2.Close()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, sql := range []string{"UPDATE quota_audit SET actor = 'mallory'", "DELETE FROM quota_audit", "TRUNCATE quota_audit"} {
		if _, err := conn.Exec(ctx, sql); err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Errorf("%s: %v, want the append-only refusal", sql, err)
		}
	}
}

// A write by one process reaches another's index through LISTEN/NOTIFY well
// within a second, with polling far slower, so it must be the notification.
func TestSyncerFollowsNotifications(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := pgtest.Database(t)
	writer, err := quota.OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	reader, err := quota.NewPostgres(url)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	idx := &quota.Index{}
	synced := make(chan int64, 100)
	s := &quota.Syncer{Store: reader, Index: idx, Poll: time.Hour, SnapshotPath: filepath.Join(t.TempDir(), "snap.bin"),
		Synced: func(v int64) { synced <- v }}
	if err := s.Start(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	time.Sleep(300 * time.Millisecond) // the listener connects
	for i := range 20 {
		start := time.Now()
		if _, err := writer.Put(ctx, mkQuota("k", "pro", quota.Override{Descriptor: "tier:pro", RequestsPerUnit: int64(i + 1), Unit: rules.Minute}), "t"); err != nil {
			t.Fatal(err)
		}
		for {
			q := idx.QuotaAt(time.Now().UnixNano(), "k")
			if q != nil && q.Overrides[0].RequestsPerUnit == int64(i+1) {
				break
			}
			if time.Since(start) > time.Second {
				t.Fatalf("change %d not in the index after 1s", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if _, err := writer.Delete(ctx, "k", "t"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Second)
	for idx.QuotaAt(time.Now().UnixNano(), "k") != nil {
		if time.Now().After(deadline) {
			t.Fatal("the delete did not reach the index within 1s")
		}
		time.Sleep(time.Millisecond)
	}
}

// With PostgreSQL unreachable at start, a Syncer enforces the snapshot file
// an earlier run left; with no file it starts empty.
func TestSyncerStartsFromSnapshotWhenStoreIsDown(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := pgtest.Database(t)
	p, err := quota.OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Put(ctx, mkQuota("gold", "pro"), "t"); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(t.TempDir(), "snap.bin")
	idx := &quota.Index{}
	saved := make(chan int64, 10)
	s := &quota.Syncer{Store: p, Index: idx, SnapshotPath: snap, Synced: func(v int64) { saved <- v }}
	if err := s.Start(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	<-saved
	// The save runs in the background: wait for the file.
	waitFile(t, snap)
	s.Wait()

	down, err := quota.NewPostgres("postgres://postgres@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	idx2 := &quota.Index{}
	s2 := &quota.Syncer{Store: down, Index: idx2, SnapshotPath: snap}
	if err := s2.Start(ctx, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if q := idx2.QuotaAt(time.Now().UnixNano(), "gold"); q == nil || q.Tier != "pro" || s2.Loaded() {
		t.Fatalf("restart while the store is down: quota %+v, loaded %v; want the snapshot's tier pro", q, s2.Loaded())
	}
	idx3 := &quota.Index{}
	s3 := &quota.Syncer{Store: down, Index: idx3, SnapshotPath: filepath.Join(t.TempDir(), "none.json")}
	if err := s3.Start(ctx, time.Second); err != nil || idx3.Len() != 0 {
		t.Fatalf("no snapshot: %v, %d quotas", err, idx3.Len())
	}
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, _, err := quota.ReadSnapshotForTest(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not written within 5s", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A damaged snapshot stops the start with a message naming the file and the
// line, rather than starting with fewer quotas than the last run enforced.
func TestDamagedSnapshot(t *testing.T) {
	dir := t.TempDir()
	f, err := quota.OpenFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b"} {
		if _, err := f.Put(context.Background(), mkQuota(k, "pro"), "t"); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "quotas.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	for name, text := range map[string]string{
		"bad line":  lines[0] + "\n" + lines[1] + "\n{\"api_key\":\n",
		"truncated": lines[0] + "\n" + lines[1] + "\n",
	} {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := quota.OpenFile(dir)
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want an error naming %s", name, err, path)
		}
		if name == "bad line" && !strings.Contains(err.Error(), ":3") {
			t.Errorf("%s: %v, want it to name line 3", name, err)
		}
	}
}

// A Syncer's load from PostgreSQL reads rows in the table's order, where a
// key's rows need not be adjacent: each key still gets its tier, times and
// every override, exactly as a Get (which reads in key order) sees it.
func TestPostgresLoadOfScatteredRows(t *testing.T) {
	ctx := context.Background()
	p, conn := openWithConn(t)
	// Inserted in this order, so a seq scan returns them so: a's and c's
	// overrides come before, between and after other keys' rows.
	for _, row := range [][]any{
		{"c", "tier:pro", "pro", 5, "minute", nil},
		{"a", "", "pro", nil, nil, time.Unix(100, 0)},
		{"b", "", "free", nil, nil, nil},
		{"a", "tier:pro", "pro", 9, "hour", time.Unix(100, 0)},
		{"c", "", "pro", nil, nil, nil},
		{"b2", "", "", nil, nil, nil},
		{"a", "api_key.endpoint=GET /", "pro", 3, "second", time.Unix(100, 0)},
	} {
		if _, err := conn.Exec(ctx, `INSERT INTO quota_overrides (api_key, descriptor, tier, requests_per_unit, unit, effective_at) VALUES ($1, $2, $3, $4, $5, $6)`, row...); err != nil {
			t.Fatal(err)
		}
	}
	idx := &quota.Index{}
	if err := (&quota.Syncer{Store: p, Index: idx}).Start(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if idx.Len() != 4 {
		t.Fatalf("%d quotas loaded, want 4", idx.Len())
	}
	for _, k := range []string{"a", "b", "b2", "c"} {
		want, err := p.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		got := idx.Get(k)
		if got == nil || !reflect.DeepEqual(data([]*quota.Quota{got}), data([]*quota.Quota{want})) {
			t.Errorf("%s: loaded %+v, Get says %+v", k, got, want)
		}
	}
	if a := idx.Get("a"); len(a.Overrides) != 2 || a.EffectiveAt != quota.TimeOf(time.Unix(100, 0)) {
		t.Errorf("a: %+v, want two overrides and effective_at 100", a)
	}
}

// Loads that overlap (several PoPs in one process) leave the garbage
// collector's target as they found it, whichever finishes last.
func TestBulkLoadRestoresGCPercent(t *testing.T) {
	before := debug.SetGCPercent(137)
	defer debug.SetGCPercent(before)
	a := quota.BulkLoadForTest()
	b := quota.BulkLoadForTest()
	if got := debug.SetGCPercent(400); got != 400 {
		t.Fatalf("during two loads the target is %d, want 400", got)
	}
	a()
	a() // a second call does nothing
	if got := debug.SetGCPercent(400); got != 400 {
		t.Fatalf("with one load left the target is %d, want 400", got)
	}
	b()
	if got := debug.SetGCPercent(137); got != 137 {
		t.Fatalf("after both loads the target is %d, want the 137 they found", got)
	}
}

// openWithConn opens the quota store on a database of its own, and a plain
// connection to it for the test to write rows with; both close at the end.
func openWithConn(t *testing.T) (*quota.Postgres, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	url := pgtest.Database(t)
	p, err := quota.OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	return p, conn
}
