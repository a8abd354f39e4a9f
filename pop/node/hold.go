package node

import (
	"context"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/limit"
)

// holdStore is a pop.Store whose checks of region and global items wait
// until the PoP has caught up on what the other PoPs admitted while it was
// down (release, called through ReplicaHooks.CaughtUp), or until the
// request's context ends. Checks of pop-scope items only never wait. Safe for
// concurrent use.
type holdStore struct {
	pop.Store
	open chan struct{} // closed by release
	once sync.Once
}

func newHoldStore(st pop.Store) *holdStore {
	return &holdStore{Store: st, open: make(chan struct{})}
}

// release lets every check through from now on.
func (h *holdStore) release() { h.once.Do(func() { close(h.open) }) }

// CheckAt waits while the store is held and items count other PoPs' hits,
// then checks at now plus the time it waited. It returns the context's
// error when the request's context ends first.
func (h *holdStore) CheckAt(ctx context.Context, now, hits int64, items []limit.Item, out []limit.Decision) error {
	select {
	case <-h.open:
	default:
		if replicated(items) {
			began := time.Now()
			select {
			case <-h.open:
				now += int64(time.Since(began))
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return h.Store.CheckAt(ctx, now, hits, items, out)
}

func replicated(items []limit.Item) bool {
	for _, it := range items {
		if it.Scope != limit.ScopePOP {
			return true
		}
	}
	return false
}
