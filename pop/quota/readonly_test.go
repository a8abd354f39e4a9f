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
	role := "edgelimit_ro_" + hex.EncodeToString(b[:])
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	u, _ := url.Parse(dbURL)
	dbName := u.Path[1:]
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
		"GRANT CONNECT ON DATABASE " + dbName + " TO " + role,
		"GRANT USAGE ON SCHEMA public TO " + role,
		"GRANT SELECT ON ALL TABLES IN SCHEMA public TO " + role,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
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
		_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+dbName+" WITH (FORCE)")
		_, _ = c.Exec(ctx, "DROP ROLE IF EXISTS "+role)
	})
	u.User = url.User(role)
	ro, err := quota.OpenPostgres(ctx, u.String())
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
