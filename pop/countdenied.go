package pop

import (
	"context"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// SetCountDenied makes pop-scope limits count the hits of denied requests
// too, as Envoy's ratelimit counts every hit (INCRBY before it compares): a
// client that keeps sending while over stays over, and a request denied by one
// limit still spends the others it matched. Off by default: a denied request
// spends nothing. Region and global limits never count denied hits: their
// counts replicate, and a receiver rejects a count no PoP could have admitted.
// Checks that only peek (hits_addend 0) count nothing either way.
func (e *Engine) SetCountDenied(on bool) { e.countDenied.Store(on) }

// spendDenied decides for real, on h hits, the items of a group that
// decideGroupsFrom reaches after the request was denied and that count denied
// hits (limit.Item.CountDenied): Envoy's ratelimit counts every descriptor's
// hits, those after an over-limit one too. It takes them out of s.groupIdx
// and s.groupItems, which keep the items to peek at, and returns how many it
// decided. Items of repeated keys have CountDenied lifted (liftCountDenied)
// and stay to be peeked at: countRepeated counts them.
func (e *Engine) spendDenied(ctx context.Context, s *scratch, nowNs, h int64) (int, error) {
	var idx []int
	var items []limit.Item
	k := 0
	for j, i := range s.groupIdx {
		if it := s.groupItems[j]; it.CountsDenied() {
			idx, items = append(idx, i), append(items, it)
			continue
		}
		s.groupIdx[k], s.groupItems[k] = i, s.groupItems[j]
		k++
	}
	s.groupIdx, s.groupItems = s.groupIdx[:k], s.groupItems[:k]
	if len(idx) == 0 {
		return 0, nil
	}
	out := make([]limit.Decision, len(idx))
	if err := e.store.CheckAt(ctx, nowNs, h, items, out); err != nil {
		return 0, err
	}
	for j, i := range idx {
		s.out[i], s.decided[i] = out[j], true
	}
	return len(idx), nil
}
