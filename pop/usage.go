package pop

import (
	"context"
	"fmt"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// Usage is how much of one limit a tenant key has used.
type Usage struct {
	// Descriptor is the request descriptor the limit counts (for a tier
	// limit, the tenant entry alone).
	Descriptor []rules.Entry
	// Limit is the limit in force for the key: the rule's, or the key's
	// override of it.
	Limit *rules.Limit
	// Tier is the tier the limit belongs to ("" for a descriptor limit).
	Tier string
	// Used is how much of the limit is spent: the limit less Remaining, so at
	// most the limit (a key whose limit was lowered below its count shows
	// it all used). Remaining is how many more hits the limit allows now,
	// from the sliding estimate across the limit's scope (this PoP's own and
	// the replicated counts); Reset the time until its window ends (or its
	// bucket is full).
	Used, Remaining int64
	Reset           time.Duration
}

// UsageAt reports, without counting a hit, every limit the tenant key has in
// domain at now: its tier's limits and the limits of every descriptor through
// the tenant entry whose other entries have exact values
// (rules.Domain.UsageDescriptors). It fails for an unknown domain or one
// without tenants, and with the store's error.
func (e *Engine) UsageAt(ctx context.Context, now time.Time, domain, key string) ([]Usage, error) {
	dom := e.rules.Load().Domain(domain)
	if dom == nil {
		return nil, fmt.Errorf("domain %q is not in the rules", domain)
	}
	if dom.Tenants == nil {
		return nil, fmt.Errorf("domain %q has no tenants section", domain)
	}
	nowNs := now.UnixNano()
	var (
		out   []Usage
		items []limit.Item
		seen  = map[string]bool{}
	)
	share := e.share.Load()
	add := func(desc []rules.Entry, l *rules.Limit, tier string, k []byte) {
		if l.Unlimited || seen[string(k)] {
			return
		}
		seen[string(k)] = true
		out = append(out, Usage{Descriptor: desc, Limit: l, Tier: tier})
		items = append(items, itemFor(l, k, share, false)) // a read never counts
	}
	tdesc := []rules.Entry{{Key: dom.Tenants.Key, Value: key}}
	q, tier, _ := e.tenant(dom, tdesc, nowNs)
	tierName := dom.Tenants.DefaultTier
	if q != nil && q.Tier != "" && dom.Tenants.HasTier(q.Tier) {
		tierName = q.Tier
	}
	for _, l := range tier {
		l = q.Limit(l)
		add(tdesc, l, tierName, l.AppendTenantKey(nil, dom.Tenants.Key, key))
	}
	for _, desc := range dom.UsageDescriptors(key) {
		for _, l := range dom.Match(desc) {
			l = q.Limit(l)
			add(desc, l, "", l.AppendKey(nil, desc))
		}
	}
	if len(items) == 0 {
		return nil, nil
	}
	dec := make([]limit.Decision, len(items))
	// A check of more hits than any of the limits holds is denied and
	// spends nothing: a read (see peekHits).
	if err := e.store.CheckAt(ctx, nowNs, peekHits(items), items, dec); err != nil {
		return nil, fmt.Errorf("pop: store: %w", err)
	}
	for i := range out {
		d := peek(dec[i])
		out[i].Remaining, out[i].Reset = d.Remaining, time.Duration(d.Reset)
		out[i].Used = max(0, items[i].Spec.Limit-d.Remaining)
	}
	return out, nil
}
