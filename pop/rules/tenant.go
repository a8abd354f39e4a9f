package rules

import "slices"

// Tenants is a domain's tenant configuration (the rule file's tenants
// section): which descriptor entry names the tenant (Key, e.g. "api_key"),
// the named tiers — each a set of limits — and the tier of a key the quota
// store gives none (DefaultTier).
//
// A request descriptor that carries the tenant entry gets, besides the limits
// it matches in the descriptor tree, the limits of its key's tier, counted per
// key. Every matching limit is checked and the most restrictive decides. A
// tier limit's counter is keyed by the domain, the tenant entry, the unit,
// algorithm and scope — not by the tier — so a key moving between tiers keeps
// its counts. Tenants is read-only once loaded.
type Tenants struct {
	Key         string
	DefaultTier string
	tiers       map[string][]*Limit
	names       []string // in file order
	// overridable are the names of the limits a per-key override may
	// replace: the tier limits and the limits of descriptors below the
	// tenant entry.
	overridable map[string]bool
}

// Tier returns the limits of the named tier, or of the default tier when
// there is no tier of that name (a key the quota store gives a tier the rule
// file no longer has is limited as a key without a tier). The result aliases
// the rule set.
func (t *Tenants) Tier(name string) []*Limit {
	if ls, ok := t.tiers[name]; ok {
		return ls
	}
	return t.tiers[t.DefaultTier]
}

// HasTier reports whether the rule file defines the named tier.
func (t *Tenants) HasTier(name string) bool {
	_, ok := t.tiers[name]
	return ok
}

// TierNames returns the tiers' names in file order.
func (t *Tenants) TierNames() []string { return slices.Clone(t.names) }

// Overridable reports whether a per-key override may replace the limit named
// name: a tier limit, or a limit of a descriptor below the tenant entry.
func (t *Tenants) Overridable(name string) bool { return t.overridable[name] }

// TenantValue returns the value of the tenant entry among entries.
func (t *Tenants) TenantValue(entries []Entry) (string, bool) {
	for _, e := range entries {
		if e.Key == t.Key {
			return e.Value, true
		}
	}
	return "", false
}

// AppendTenantKey appends the store key of tier limit l for the tenant whose
// entry is key=value. It is AppendKey of the entries (key=value) followed by
// an entry with an empty key, which no request can carry (Validate rejects
// empty keys), so a tier limit never shares a counter with a descriptor limit.
func (l *Limit) AppendTenantKey(dst []byte, key, value string) []byte {
	e := [2]Entry{{Key: key, Value: value}}
	return l.AppendKey(dst, e[:])
}

// UsageDescriptors returns the descriptors of domain d whose limits a tenant
// key has, with value as the tenant entry's value: every path of the
// descriptor tree through the tenant entry whose other entries have exact
// values (a wildcard or key-only entry other than the tenant's cannot be
// enumerated). It is what an admin asks the engine about to report a key's
// usage.
func (d *Domain) UsageDescriptors(value string) [][]Entry {
	if d.Tenants == nil {
		return nil
	}
	var out [][]Entry
	var walk func(n *Node, path []Entry, tenant bool)
	walk = func(n *Node, path []Entry, tenant bool) {
		if tenant && len(n.limits) > 0 {
			out = append(out, slices.Clone(path))
		}
		if len(path) >= maxDepth {
			return
		}
		for _, k := range sortedKeys(n.children) {
			kn := n.children[k]
			if k == d.Tenants.Key && !tenant {
				if c := kn.values[value]; c != nil {
					walk(c, append(path, Entry{k, value}), true)
				} else if c := matchPrefix(kn, value); c != nil {
					walk(c, append(path, Entry{k, value}), true)
				} else if kn.any != nil {
					walk(kn.any, append(path, Entry{k, value}), true)
				}
				continue
			}
			for _, v := range sortedKeys(kn.values) {
				walk(kn.values[v], append(path, Entry{k, v}), tenant)
			}
		}
	}
	walk(&d.root, nil, false)
	return out
}

func matchPrefix(kn *keyNode, value string) *Node {
	for _, p := range kn.prefixes {
		if len(value) >= len(p.prefix) && value[:len(p.prefix)] == p.prefix {
			return p.node
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// overridableBelow collects the names of the limits of n and below it; under
// says whether the path to n passed the tenant entry.
func overridableBelow(n *Node, tenantKey string, under bool, out map[string]bool) {
	if under {
		for _, l := range n.limits {
			out[l.Name] = true
		}
	}
	for k, kn := range n.children {
		u := under || k == tenantKey
		for _, c := range kn.values {
			overridableBelow(c, tenantKey, u, out)
		}
		for _, p := range kn.prefixes {
			overridableBelow(p.node, tenantKey, u, out)
		}
		if kn.any != nil {
			overridableBelow(kn.any, tenantKey, u, out)
		}
	}
}

// tenants parses the tenants section of a rule file:
//
//	tenants:
//	  key: api_key          # the descriptor entry that names the tenant
//	  default_tier: free    # the tier of a key the quota store gives none
//	  tiers:
//	    - name: free
//	      rate_limit: {unit: minute, requests_per_unit: 100}
//	    - name: pro
//	      rate_limits:
//	        - {unit: minute, requests_per_unit: 5000, scope: global}
//	        - {unit: day, requests_per_unit: 1000000, scope: global}
//
// Tier limits take every rate_limit field; their default names are
// "tier:<name>" (plus "_<unit>" with several limits).
func (p *parser) tenants(f field) *Tenants {
	m := p.mapping(f.val, "tenants", []string{"key", "default_tier", "tiers"}, nil)
	if m == nil {
		return nil
	}
	t := &Tenants{tiers: map[string][]*Limit{}, overridable: map[string]bool{}}
	k, ok := m["key"]
	if !ok {
		p.errorf(f.key, "tenants needs a key: the descriptor entry that names the tenant (e.g. key: api_key)")
		return nil
	}
	if t.Key, ok = p.str(k, "tenants.key"); ok && t.Key == "" {
		p.errorf(k.val, "tenants.key must not be empty")
	}
	tiers, ok := m["tiers"]
	if !ok {
		p.errorf(f.key, "tenants needs tiers: a list of named sets of limits")
		return nil
	}
	items, ok := p.list(tiers, "tenants.tiers")
	if ok && len(items) == 0 {
		p.errorf(tiers.key, "tenants.tiers must list at least one tier")
	}
	seen := map[string]int{}
	for _, it := range items {
		tm := p.mapping(it, "tier", []string{"name", "rate_limit", "rate_limits"}, nil)
		if tm == nil {
			continue
		}
		nf, ok := tm["name"]
		if !ok {
			p.errorf(it, "tier has no name")
			continue
		}
		name, ok := p.str(nf, "tier name")
		if !ok {
			continue
		}
		if name == "" || len(name) > 64 || name != trimmedName(name) {
			p.errorf(nf.val, "tier name %q: want 1 to 64 printable ASCII characters without spaces, \" or \\", name)
			continue
		}
		if first, dup := seen[name]; dup {
			p.errorf(nf.val, "tier %q is defined twice (first at line %d)", name, first)
			continue
		}
		seen[name] = line(nf.val)
		if _, one := tm["rate_limit"]; !one {
			if _, many := tm["rate_limits"]; !many {
				p.errorf(it, "tier %q has no rate_limit or rate_limits", name)
				continue
			}
		}
		node := &Node{}
		before := len(p.limits)
		p.descriptorLimits(tm, "tier:"+name, node, false, false, nil)
		for _, l := range p.limits[before:] {
			if l.Unlimited {
				p.errorf(it, "tier %q: an unlimited tier limit limits nothing; leave the limit out", name)
			}
		}
		t.tiers[name] = node.Limits()
		t.names = append(t.names, name)
	}
	if d, ok := m["default_tier"]; ok {
		if t.DefaultTier, ok = p.str(d, "default_tier"); ok {
			if _, known := t.tiers[t.DefaultTier]; !known && len(t.tiers) > 0 {
				p.errorf(d.val, "default_tier %q is not one of the tiers (%v)", t.DefaultTier, t.names)
			}
		}
	} else {
		p.errorf(f.key, "tenants needs a default_tier: the tier of a key the quota store gives none")
	}
	return t
}

// trimmedName is name without the characters a tier name may not hold.
func trimmedName(name string) string {
	out := make([]byte, 0, len(name))
	for i := 0; i < len(name); i++ {
		if c := name[i]; c > ' ' && c <= '~' && c != '"' && c != '\\' {
			out = append(out, c)
		}
	}
	return string(out)
}

// finish records, once the descriptor tree and every limit's name are
// final, which limits an override may replace.
func (t *Tenants) finish(root *Node) {
	for _, ls := range t.tiers {
		for _, l := range ls {
			t.overridable[l.Name] = true
		}
	}
	overridableBelow(root, t.Key, false, t.overridable)
}
