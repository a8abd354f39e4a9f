package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

func TestRedactURL(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"embedded", "embedded"},
		{"redis://127.0.0.1:6379", "redis://127.0.0.1:6379"},
		{"redis://:s3cret@127.0.0.1:6379/2", "redis://:xxxxx@127.0.0.1:6379/2"},
		{"rediss://user:s3cret@host:6380", "rediss://user:xxxxx@host:6380"},
		{"redis://:s3cret@a:1,b:2,c:3", "redis://:xxxxx@a:1,b:2,c:3"},
		{":s3cret@a:1", "redis://:xxxxx@a:1"},
		{"redis://:s3%zz@a:1", "<unparsable>"},
	} {
		got := RedactURL(c.in)
		if got != c.want || strings.Contains(got, "s3cret") {
			t.Errorf("RedactURL(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// A URL that does not parse is reported without the password in it.
func TestOpenRedisBadURLHidesPassword(t *testing.T) {
	_, err := OpenRedis(RedisConfig{URL: "redis://:s3cret%zz@127.0.0.1:1"})
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("OpenRedis error %v: want an error without the password", err)
	}
}

// Ping tells a refused password (ErrRedisAuth) from success, against a real
// redis-server with requirepass; Password overrides the URL's.
func TestRedisPingAuth(t *testing.T) {
	srv := redistest.StartWithPassword(t, "ping-pw")
	for _, c := range []struct {
		name, url, password string
		wantAuthErr         bool
	}{
		{"no password", "redis://" + srv.Addr, "", true},
		{"wrong in URL", "redis://:nope@" + srv.Addr, "", true},
		{"right in URL", "redis://:ping-pw@" + srv.Addr, "", false},
		{"right apart", "redis://:nope@" + srv.Addr, "ping-pw", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := OpenRedis(RedisConfig{URL: c.url, Password: c.password, ClockSource: ClockLocal})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			err = s.Ping(ctx)
			// Under a loaded full run the first connection was closed
			// unanswered now and then ("redis unreachable: EOF"; not traced,
			// never alone in 40 runs): that says nothing of how a refusal is
			// told apart, so ask again while the server's answer is neither.
			for err != nil && !errors.Is(err, ErrRedisAuth) && ctx.Err() == nil {
				time.Sleep(20 * time.Millisecond)
				err = s.Ping(ctx)
			}
			if got := errors.Is(err, ErrRedisAuth); got != c.wantAuthErr || (!c.wantAuthErr && err != nil) {
				t.Fatalf("Ping: %v, want auth error %v", err, c.wantAuthErr)
			}
		})
	}
}
