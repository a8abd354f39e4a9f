package quota_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/edgelimit/edgelimit/pop/quota"
	"github.com/edgelimit/edgelimit/pop/quota/pgtest"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// The grants docs/quota-store-operations.md shows for a PoP's role, run as
// written (role and database renamed): the first SQL block lets a PoP read
// its quotas and nothing more, the second lets it serve the admin API too.
// Before, the page named the admin API's table rights in prose only, and a
// role given exactly those could not write an override: the audit row's id
// comes from the sequence quota_audit_id_seq ("permission denied for
// sequence"), so every admin write was a 503.
func TestPostgresDocumentedGrants(t *testing.T) {
	doc, err := os.ReadFile("../../docs/quota-store-operations.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(string(doc), -1)
	if len(blocks) < 2 {
		t.Fatalf("docs/quota-store-operations.md shows %d SQL blocks, want two: a read-only role's grants, then the admin API's", len(blocks))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL := pgtest.Database(t)
	admin, err := quota.OpenPostgres(ctx, dbURL) // the operator migrates
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Put(ctx, &quota.Quota{APIKey: "abc123", Tier: "pro"}, "test"); err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "edgelimit_doc_" + hex.EncodeToString(b[:])
	u, _ := url.Parse(dbURL)
	dbName := u.Path[1:]
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, pgtest.ServerURL())
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+dbName+" WITH (FORCE)")
		_, _ = c.Exec(ctx, "DROP ROLE IF EXISTS "+role)
	})
	run := func(block string) {
		t.Helper()
		for _, stmt := range strings.Split(block, ";") {
			var lines []string
			for _, l := range strings.Split(stmt, "\n") {
				if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "--") {
					lines = append(lines, l)
				}
			}
			q := strings.Join(lines, " ")
			if q == "" {
				continue
			}
			if strings.HasPrefix(q, "CREATE ROLE") {
				q = "CREATE ROLE " + role + " LOGIN" // the docs' password is a placeholder
			}
			q = strings.ReplaceAll(q, "edgelimit_pop", role)
			q = strings.ReplaceAll(q, "DATABASE quotas", "DATABASE "+dbName)
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Fatalf("the docs' %q: %v", q, err)
			}
		}
	}
	if _, err := conn.Exec(ctx, "REVOKE CREATE ON SCHEMA public FROM PUBLIC"); err != nil {
		t.Fatal(err)
	}
	run(blocks[0][1])
	u.User = url.User(role)
	ro, err := quota.OpenPostgres(ctx, u.String())
	if err != nil {
		t.Fatalf("open with the docs' read-only role: %v", err)
	}
	defer ro.Close()
	if q, err := ro.Get(ctx, "abc123"); err != nil || q.Tier != "pro" {
		t.Fatalf("Get with the docs' read-only role: %+v, %v", q, err)
	}
	if _, err := ro.Put(ctx, &quota.Quota{APIKey: "abc123", Tier: "free"}, "test"); err == nil {
		t.Fatal("Put with the docs' read-only role succeeded")
	}
	run(blocks[1][1])
	if _, err := ro.Put(ctx, &quota.Quota{APIKey: "abc123", Tier: "free", Overrides: []quota.Override{{Descriptor: "tier:free", RequestsPerUnit: 7, Unit: rules.Hour}}}, "test"); err != nil {
		t.Fatalf("Put with the docs' admin API grants: %v", err)
	}
	if _, err := ro.Put(ctx, &quota.Quota{APIKey: "new456", Tier: "pro"}, "test"); err != nil {
		t.Fatalf("Put of a new key with the docs' admin API grants: %v", err)
	}
	if _, err := ro.Delete(ctx, "new456", "test"); err != nil {
		t.Fatalf("Delete with the docs' admin API grants: %v", err)
	}
}
