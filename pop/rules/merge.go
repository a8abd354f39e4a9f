package rules

import (
	"fmt"
	"slices"
)

// merge adds the descriptors of o, another file's definition of the same
// domain, to d (Options.MergeDomains). A top-level descriptor both define —
// the same key and value — is an error, as in Envoy's ratelimit, and so is a
// forward_auth section in both. On error d is unchanged.
func (d *Domain) merge(o *Domain) error {
	for key, okn := range o.root.children {
		kn := d.root.children[key]
		if kn == nil {
			continue
		}
		for v := range okn.values {
			if _, dup := kn.values[v]; dup {
				return fmt.Errorf("domain %q: descriptor %s=%s is already defined in %s", d.Name, key, v, d.File)
			}
		}
		for _, p := range okn.prefixes {
			if slices.ContainsFunc(kn.prefixes, func(q prefixNode) bool { return q.prefix == p.prefix }) {
				return fmt.Errorf("domain %q: descriptor %s=%s* is already defined in %s", d.Name, key, p.prefix, d.File)
			}
		}
		for _, g := range okn.globs {
			if slices.ContainsFunc(kn.globs, func(h globNode) bool { return h.pattern == g.pattern }) {
				return fmt.Errorf("domain %q: descriptor %s=%s is already defined in %s", d.Name, key, g.pattern, d.File)
			}
		}
		if okn.any != nil && kn.any != nil {
			return fmt.Errorf("domain %q: descriptor %s is already defined in %s", d.Name, key, d.File)
		}
	}
	if o.ForwardAuth != nil && d.ForwardAuth != nil {
		return fmt.Errorf("domain %q: forward_auth is already defined in %s", d.Name, d.File)
	}
	if o.Tenants != nil && d.Tenants != nil {
		return fmt.Errorf("domain %q: tenants is already defined in %s", d.Name, d.File)
	}
	if o.ForwardAuth != nil {
		d.ForwardAuth = o.ForwardAuth
	}
	if o.Tenants != nil {
		d.Tenants = o.Tenants
	}
	// The merged tree may hold more limits below the tenant entry.
	defer func() {
		if d.Tenants != nil {
			d.Tenants.finish(&d.root)
		}
	}()
	if d.root.children == nil && len(o.root.children) > 0 {
		d.root.children = make(map[string]*keyNode)
	}
	for key, okn := range o.root.children {
		kn := d.root.children[key]
		if kn == nil {
			d.root.children[key] = okn
			continue
		}
		for v, c := range okn.values {
			if kn.values == nil {
				kn.values = make(map[string]*Node)
			}
			kn.values[v] = c
		}
		for _, p := range okn.prefixes {
			d.root.Child(key, p.prefix+"*").replaceWith(p.node)
		}
		kn.globs = append(kn.globs, okn.globs...)
		if okn.any != nil {
			kn.any = okn.any
		}
	}
	return nil
}

// replaceWith makes n the node o is; n is a fresh, empty node.
func (n *Node) replaceWith(o *Node) { *n = *o }

// resolveReplaces turns the names each limit replaces into the limits of the
// domain with those configured names. A name no limit has replaces nothing,
// as in Envoy's ratelimit.
func (d *Domain) resolveReplaces() {
	all := d.root.collect(nil)
	byName := map[string][]*Limit{}
	for _, l := range all {
		if l.configured != "" {
			byName[l.configured] = append(byName[l.configured], l)
		}
	}
	for _, l := range all {
		l.Replaces = nil
		for _, name := range l.replaces {
			l.Replaces = append(l.Replaces, byName[name]...)
			d.replaces = true
		}
	}
}

// HasReplaces reports whether a limit of the domain replaces others.
func (d *Domain) HasReplaces() bool { return d.replaces }
