package pop

import (
	"github.com/edgelimit/edgelimit/pop/quota"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// Quotas tells the engine the plan of an API key's quota — its tier and
// overrides — in force at now (Unix ns), or nil. It must not allocate: it is
// on the check path (quota.Index).
type Quotas interface {
	QuotaAt(now int64, key string) *quota.Plan
}

// UseQuotas makes the engine limit tenants: a descriptor that carries its
// domain's tenant entry (rules.Tenants) gets its key's tier limits, and an
// override in q replaces the quota of the limit it names. Call it before
// serving.
func (e *Engine) UseQuotas(q Quotas) { e.quotas = q }

// tenant returns, for a descriptor of dom with entries, the plan of its
// tenant key's quota (nil when none is in force), the limits of the key's tier, and
// the key. A domain without tenants, or a descriptor without the tenant
// entry, has none of them.
func (e *Engine) tenant(dom *rules.Domain, entries []rules.Entry, now int64) (*quota.Plan, []*rules.Limit, string) {
	t := dom.Tenants
	if t == nil {
		return nil, nil, ""
	}
	key, ok := t.TenantValue(entries)
	if !ok {
		return nil, nil, ""
	}
	var q *quota.Plan
	tier := t.DefaultTier
	if e.quotas != nil {
		if q = e.quotas.QuotaAt(now, key); q != nil && q.Tier != "" {
			tier = q.Tier
		}
	}
	return q, t.Tier(tier), key
}
