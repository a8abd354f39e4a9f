// Package pgtest gives a test its own PostgreSQL database on the machine's
// server (PGTEST_URL, default postgres://postgres@127.0.0.1:5432/postgres):
// created with a random name, dropped when the test ends. Under CI=true a
// server that does not answer fails the test; elsewhere it skips it, saying
// why.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/edgelimit/edgelimit/pop/quota"
)

// DefaultURL is the server tests use when PGTEST_URL is not set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// ServerURL is the URL of the server's maintenance database.
func ServerURL() string {
	if u := os.Getenv("PGTEST_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Database creates a fresh database and returns its URL; it is dropped
// (connections and all) when t ends.
func Database(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, ServerURL())
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL at %s does not answer (CI=true: tests that need it fail): %v", ServerURL(), err)
		}
		t.Skipf("PostgreSQL at %s does not answer; set PGTEST_URL or start it: %v", ServerURL(), err)
	}
	defer conn.Close(context.Background())
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "edgelimit_test_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, ServerURL())
		if err != nil {
			t.Logf("drop database %s: %v", name, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// Store opens the quota store on a fresh database (Database), its
// migrations applied, closed when t ends.
func Store(t testing.TB) *quota.Postgres {
	t.Helper()
	p, err := quota.OpenPostgres(context.Background(), Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}
