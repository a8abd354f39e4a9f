package store

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// ErrRedisAuth marks (wrapped) a Ping refused because the store's credentials
// are wrong or missing: it will not heal by itself, unlike a lost connection.
var ErrRedisAuth = errors.New("redis refused authentication")

// Ping asks the server (in a Cluster, one node) whether it answers and
// accepts this store's credentials, and whether it is this store's
// replica's (redis_owner.go), within ctx. It returns nil, an error wrapping
// ErrReplicaConflict when another replica's counts are in it, an error
// wrapping ErrRedisAuth when the server refuses the credentials (WRONGPASS,
// NOAUTH), or the connection error. It never blocks a check, and the errors
// it returns never contain the password.
func (s *Redis) Ping(ctx context.Context) error {
	err := s.client.Ping(ctx).Err()
	if err == nil {
		if err := s.claim(ctx, s.client); errors.Is(err, ErrReplicaConflict) {
			return err
		}
		s.register(ctx) // best effort: a failure keeps the last count
		return nil
	}
	if conflict := s.ownerConflict(); conflict != nil && errors.Is(err, ErrReplicaConflict) {
		return conflict // a new connection's check found it (onConnect)
	}
	if isAuthError(err) {
		return fmt.Errorf("%w: %v", ErrRedisAuth, err)
	}
	return fmt.Errorf("redis unreachable: %w", err)
}

// isAuthError reports whether err is the server's refusal of credentials.
func isAuthError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"WRONGPASS", "NOAUTH", "invalid password", "invalid username-password"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

// RedactURL returns a store setting fit for logs: every URL in it (a Cluster
// seed list has several, comma-separated) with its password replaced by
// "xxxxx", as url.URL.Redacted does. A part that does not parse as a URL is
// replaced by "<unparsable>" if it might hold credentials ('@' in it).
func RedactURL(store string) string {
	parts := strings.Split(store, ",")
	for i, p := range parts {
		if !strings.Contains(p, "@") {
			continue
		}
		trimmed := strings.TrimSpace(p)
		if !strings.Contains(trimmed, "://") {
			trimmed = "redis://" + trimmed
		}
		u, err := url.Parse(trimmed)
		if err != nil {
			parts[i] = "<unparsable>"
			continue
		}
		parts[i] = u.Redacted()
	}
	return strings.Join(parts, ",")
}

// redactURLError drops the URL that net/url quotes in its parse errors (it
// would print the password), keeping the reason.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}
