package quota_test

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/quota"
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
	f := migratedForRole(ctx, t, "edgelimit_doc_")
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
				q = "CREATE ROLE " + f.role + " LOGIN" // the docs' password is a placeholder
			}
			q = strings.ReplaceAll(q, "edgelimit_pop", f.role)
			q = strings.ReplaceAll(q, "DATABASE quotas", "DATABASE "+f.dbName)
			if _, err := f.conn.Exec(ctx, q); err != nil {
				t.Fatalf("the docs' %q: %v", q, err)
			}
		}
	}
	if _, err := f.conn.Exec(ctx, "REVOKE CREATE ON SCHEMA public FROM PUBLIC"); err != nil {
		t.Fatal(err)
	}
	run(blocks[0][1])
	ro, err := quota.OpenPostgres(ctx, f.roleURL())
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
