package pop

import "github.com/edgelimit/edgelimit/pop/limit"

// SetShadowMode makes every request that a limit denies answered OK, as
// Envoy's ratelimit's SHADOW_MODE does: the statuses still say which
// descriptors are over (OVER_LIMIT, their remaining and reset), the limits'
// decisions are counted in the metrics as usual, and each such answer in
// edgelimit_shadow_mode_answers_total. What the request spends does not
// change: denied hits are counted only where SetCountDenied counts them. A
// request over a concurrency limit is answered OK without a lease. Off by
// default.
func (e *Engine) SetShadowMode(on bool) { e.shadow.Store(on) }

// SetQuotaMode holds a request to its quotas the way Envoy's ratelimit's
// QUOTA_MODE does, with the rules loaded in quota mode
// (rules.Options.QuotaMode): a request is over only when every descriptor is
// over a limit, so one that matched no limit (nor an unlimited one) keeps it
// within them. Off by default; without the rules' option it changes nothing.
func (e *Engine) SetQuotaMode(on bool) { e.quotaAll.Store(on) }

// SetOverrideAlgorithm is the algorithm that counts a request's own limit
// (Override) on a descriptor that matched no limit of its domain: the
// algorithm rules name by default (rules.Options.DefaultAlgorithm), so that
// with Envoy's ratelimit's fixed windows an override counts as the peer's
// does. The zero value is limit.SlidingWindow.
func (e *Engine) SetOverrideAlgorithm(a limit.Algorithm) { e.overrideAlg.Store(uint32(a)) }

// shadowAnswer turns res, denied, into shadow mode's answer.
func (e *Engine) shadowAnswer(res *Result) {
	res.Code = OK
	e.metrics.shadowAnswer()
}

// unmatched reports whether a descriptor of the request matched no limit
// that counts (s.owner names none of its items, nor s.dups one of its
// occurrences: a repeated descriptor counts on its first occurrence's item)
// and is not unlimited.
func (s *scratch) unmatched(res *Result) bool {
	for di := range res.Statuses {
		if res.Statuses[di].Unlimited {
			continue
		}
		found := false
		for _, o := range s.owner {
			if o == di {
				found = true
				break
			}
		}
		for _, o := range s.dups {
			found = found || o.di == di
		}
		if !found {
			return true
		}
	}
	return false
}
