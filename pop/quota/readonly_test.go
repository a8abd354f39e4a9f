package quota_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/edgelimit/edgelimit/pop/quota"
	"github.com/edgelimit/edgelimit/pop/quota/pgtest"
)

// A PoP whose PostgreSQL role may only read (no CREATE on the schema, no
// write to any table) opens a database an operator already migrated, and
// reads its quotas. Before, every open ran the migrations' CREATE TABLE IF
// NOT EXISTS, and the read-only role failed at start ("permission denied for
// schema public").
func TestPostgresReadOnlyRole(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := migratedForRole(ctx, t, "edgelimit_ro_")
	for _, q := range []string{
		"CREATE ROLE " + f.role + " LOGIN",
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
		"GRANT CONNECT ON DATABASE " + f.dbName + " TO " + f.role,
		"GRANT USAGE ON SCHEMA public TO " + f.role,
		"GRANT SELECT ON ALL TABLES IN SCHEMA public TO " + f.role,
	} {
		if _, err := f.conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	ro, err := quota.OpenPostgres(ctx, f.roleURL())
	if err != nil {
		t.Fatalf("open with a read-only role on a migrated database: %v", err)
	}
	defer ro.Close()
	q, err := ro.Get(ctx, "abc123")
	if err != nil || q.Tier != "pro" {
		t.Fatalf("Get with the read-only role: %+v, %v", q, err)
	}
	// Writes are refused, as the role says.
	if _, err := ro.Put(ctx, &quota.Quota{APIKey: "abc123", Tier: "free"}, "test"); err == nil {
		t.Fatal("Put with a read-only role succeeded")
	}
}

// roleFixture is a database an operator migrated, holding abc123's quota
// (tier pro), an operator's connection to it, and the name of a role that
// does not exist yet: the test creates it, and a cleanup drops it with the
// database.
type roleFixture struct {
	url          *url.URL // the database, as the operator
	dbName, role string
	conn         *pgx.Conn
}

// migratedForRole makes a roleFixture whose role is named prefix and a
// random suffix.
func migratedForRole(ctx context.Context, t *testing.T, prefix string) roleFixture {
	t.Helper()
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
	f := roleFixture{role: prefix + hex.EncodeToString(b[:])}
	f.url, _ = url.Parse(dbURL)
	f.dbName = f.url.Path[1:]
	if f.conn, err = pgx.Connect(ctx, dbURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.conn.Close(context.Background()) })
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, pgtest.ServerURL())
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		// Cleanups run last in, first out: this one before pgtest's, so
		// the database (which holds the role's grants) goes first here.
		_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+f.dbName+" WITH (FORCE)")
		_, _ = c.Exec(ctx, "DROP ROLE IF EXISTS "+f.role)
	})
	return f
}

// roleURL is the database's URL as the fixture's role.
func (f roleFixture) roleURL() string {
	u := *f.url
	u.User = url.User(f.role)
	return u.String()
}
