package rules

import (
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// Bounds of a concurrency limit's lease_ttl, and its default.
const (
	MinLeaseTTL     = 100 * time.Millisecond
	MaxLeaseTTL     = 24 * time.Hour
	DefaultLeaseTTL = time.Minute
)

// Concurrent reports whether l is a concurrency limit: Spec.Limit requests
// of a descriptor in flight at once (Stripe's concurrent-requests limiter),
// rather than per window. An admitted request holds a lease on a slot until
// it is released or LeaseTTL passes. Spec.Window is LeaseTTL, and the
// algorithm, Unit and Scope mean nothing: the slots are counted in the store
// the PoP's servers share (embedded: this process; Redis: every server on
// that Redis), never replicated between PoPs.
func (l *Limit) Concurrent() bool { return l.LeaseTTL > 0 }

// concurrency parses a descriptor's concurrency field,
//
//	concurrency: {max: 20, lease_ttl: 30s, name: ..., fail_closed: ...}
//
// and adds its limit to node. A descriptor has at most one (a YAML mapping
// has one such field), beside any rate limits.
func (p *parser) concurrency(f field, path string, node *Node, shadow bool) {
	m := p.mapping(f.val, "concurrency", []string{"max", "lease_ttl", "name", "fail_closed"}, nil)
	if m == nil {
		return
	}
	errs := len(p.errs)
	l := &Limit{Path: path, LeaseTTL: DefaultLeaseTTL, Name: path + "_concurrency"}
	if shadow {
		p.errorf(f.key, "shadow_mode does not apply to a concurrency limit: a shadow lease would be held and never enforced; remove one of them")
	}
	if g, ok := m["max"]; ok {
		if v, ok := p.integer(g, "concurrency.max"); ok {
			if v < 1 || v > 1<<30 {
				p.errorf(g.val, "concurrency.max must be between 1 and %d requests in flight, got %d", 1<<30, v)
			}
			l.Spec.Limit = v
		}
	} else {
		p.errorf(f.key, "concurrency has no max (the most requests in flight at once)")
	}
	if g, ok := m["lease_ttl"]; ok {
		if s, ok := p.str(g, "concurrency.lease_ttl"); ok {
			d, err := time.ParseDuration(s)
			switch {
			case err != nil:
				p.errorf(g.val, "concurrency.lease_ttl: %v (want e.g. 30s)", err)
			case d < MinLeaseTTL || d > MaxLeaseTTL:
				p.errorf(g.val, "concurrency.lease_ttl must be between %v and %v, got %v", MinLeaseTTL, MaxLeaseTTL, d)
			}
			l.LeaseTTL = d
		}
	}
	hasName := p.nameAndFailClosed(m, l, "concurrency.")
	if len(p.errs) > errs {
		return
	}
	l.Spec = limit.Spec{Limit: l.Spec.Limit, Window: int64(l.LeaseTTL)}
	node.Add(l)
	p.limits = append(p.limits, l)
	p.named = append(p.named, hasName)
}
