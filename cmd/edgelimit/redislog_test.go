package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// go-redis's lines come out as JSON records of the PoP's log, one per quiet
// interval, the next one counting those left out.
func TestRedisLogIsStructured(t *testing.T) {
	var buf bytes.Buffer
	r := newRedisLog(slog.New(slog.NewJSONHandler(&buf, nil)))
	t0 := time.Date(2026, 11, 27, 21, 0, 0, 0, time.UTC)
	at := t0
	r.now = func() time.Time { return at }
	ctx := context.Background()
	for i, d := range []time.Duration{0, time.Second, 2 * time.Second, 9 * time.Second, 10 * time.Second, 11 * time.Second} {
		at = t0.Add(d)
		r.Printf(ctx, "redis: pool.go:%d: failed to dial after %d attempts: dial tcp 127.0.0.1:1: connect: connection refused\n", 100+i, 5)
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("not a JSON record: %q (%v)", l, err)
		}
		lines = append(lines, rec)
	}
	if len(lines) != 2 {
		t.Fatalf("%d records, want 2 (at 0 s and 10 s):\n%s", len(lines), buf.String())
	}
	first, second := lines[0], lines[1]
	if first["level"] != "WARN" || first["component"] != "go-redis" || first["msg"] != "redis: pool.go:100: failed to dial after 5 attempts: dial tcp 127.0.0.1:1: connect: connection refused" || first["left_out"] != nil {
		t.Errorf("first record %v", first)
	}
	if second["msg"] != "redis: pool.go:104: failed to dial after 5 attempts: dial tcp 127.0.0.1:1: connect: connection refused" || second["left_out"] != 3.0 {
		t.Errorf("second record %v, want the line at 10 s with left_out 3", second)
	}
}
