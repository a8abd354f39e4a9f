package pop

import (
	"context"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// decideQuotaMode is decide for a request that matched quota-mode limits
// (Envoy's quota_mode): such a limit does not deny on its own; the request is
// over when an ordinary limit denies it, or when every descriptor that matched
// a quota-mode limit is over one. The store counts quota-mode items as shadow
// items (s.items[i].Shadow is set for them). So that a request denied for its
// quotas spends nothing, they are peeked at first: when all are over, every
// item is only peeked at and the request is denied. A concurrent request can
// slip between the peek and the decision; then the request is denied after
// the ordinary limits have counted it.
func (e *Engine) decideQuotaMode(ctx context.Context, s *scratch, nowNs int64) (bool, error) {
	s.groupIdx, s.groupItems = s.groupIdx[:0], s.groupItems[:0]
	for i, l := range s.limits {
		if l.QuotaMode {
			s.groupIdx = append(s.groupIdx, i)
			s.groupItems = append(s.groupItems, s.items[i])
			s.groupItems[len(s.groupItems)-1].CountDenied = false // a peek counts nothing
		}
	}
	s.groupOut = append(s.groupOut[:0], make([]limit.Decision, len(s.groupIdx))...)
	if err := e.store.CheckAt(ctx, nowNs, peekHits(s.groupItems), s.groupItems, s.groupOut); err != nil {
		return false, err
	}
	for j, i := range s.groupIdx {
		d := s.groupOut[j]
		s.out[i] = limit.Decision{Allowed: d.Remaining >= max(s.hits[i], 1), Remaining: d.Remaining, Reset: d.Reset}
	}
	if !s.allQuotaOver() {
		admitted, err := e.decide(ctx, s, nowNs)
		if err != nil || !admitted {
			return admitted, err
		}
		return !s.allQuotaOver(), nil
	}
	// Denied for its quotas: every item is only peeked at, so nothing is
	// spent — but the items that count denied hits (SetCountDenied), which
	// are decided and counted as the peer counts them, quota items too — and
	// the quota items report the peek that found them over, with no room
	// left when their hits were counted.
	over := make([]limit.Decision, len(s.out))
	copy(over, s.out)
	for i := range s.hits {
		if !s.items[i].CountDenied {
			s.hits[i] = 0
		}
	}
	if _, err := e.decideGroups(ctx, s, nowNs); err != nil {
		return false, err
	}
	for i, l := range s.limits {
		if l.QuotaMode && !over[i].Allowed {
			s.out[i] = over[i]
			s.out[i].RetryAfter = max(over[i].Reset, 1)
			if s.hits[i] > 0 && s.items[i].CountsDenied() {
				s.out[i].Remaining = 0
			}
		}
	}
	return false, nil
}

// allQuotaOver reports whether every descriptor that matched a quota-mode
// limit has one, not in shadow mode, whose decision in s.out denies.
func (s *scratch) allQuotaOver() bool {
	if s.quotaPass {
		return false
	}
	any := false
	for i, l := range s.limits {
		if !l.QuotaMode {
			continue
		}
		any = true
		over := false
		for j, m := range s.limits {
			// A shadow limit is never over, in quota mode too: Envoy's
			// ratelimit answers its descriptor OK.
			over = over || m.QuotaMode && !m.Shadow && s.owner[j] == s.owner[i] && !s.out[j].Allowed
		}
		if !over {
			return false
		}
	}
	return any
}
