// Package region is the hierarchy of a deployment: which PoP belongs to
// which region, and what a region enforces of a global limit while it is cut
// off from others. It is pure (no clock, no IO) and imports crdt at most; pop,
// replication, simulate and cmd build on it.
package region

import (
	"fmt"
	"slices"
	"strings"
)

// Topology names the regions and the PoPs in each. Every PoP of a deployment
// shares one Topology; a PoP's replica name is its PoP name, unique across
// regions. The zero Topology has no regions.
type Topology struct {
	// Regions maps a region name to its PoP names.
	Regions map[string][]string
}

// Parse reads "eu=pop-a,pop-b;us=pop-c" into a Topology. A PoP named in two
// regions, or a part without "region=", is an error.
func Parse(s string) (Topology, error) {
	t := Topology{Regions: map[string][]string{}}
	seen := map[string]string{}
	for _, part := range strings.Split(s, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		region, pops, ok := strings.Cut(part, "=")
		region = strings.TrimSpace(region)
		if !ok || region == "" {
			return t, fmt.Errorf("topology %q: want region=pop,pop;region=pop", part)
		}
		for _, p := range strings.Split(pops, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			if r, dup := seen[p]; dup {
				return t, fmt.Errorf("topology: PoP %q is in both %s and %s", p, r, region)
			}
			seen[p] = region
			t.Regions[region] = append(t.Regions[region], p)
		}
	}
	return t, nil
}

// RegionOf returns the region of pop, or "" when the topology does not name it.
func (t Topology) RegionOf(pop string) string {
	for r, pops := range t.Regions {
		if slices.Contains(pops, pop) {
			return r
		}
	}
	return ""
}

// Peers returns the other PoPs of pop's region.
func (t Topology) Peers(pop string) []string {
	var out []string
	for _, p := range t.Regions[t.RegionOf(pop)] {
		if p != pop {
			out = append(out, p)
		}
	}
	return out
}

// Others returns every PoP of the topology but pop, sorted.
func (t Topology) Others(pop string) []string {
	var out []string
	for _, pops := range t.Regions {
		for _, p := range pops {
			if p != pop {
				out = append(out, p)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Names returns the region names, sorted.
func (t Topology) Names() []string {
	out := make([]string, 0, len(t.Regions))
	for r := range t.Regions {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// Share is the part of a global limit that the regions a PoP can reach
// (itself included) enforce while the others are cut off. With perRegion 0
// it is reachable/total, so the sides of a partition together enforce at
// most one limit; otherwise reachable×perRegion, at most 1. With every
// region reachable it is 1.
func Share(reachable, total int, perRegion float64) float64 {
	if total <= 0 || reachable >= total {
		return 1
	}
	reachable = max(reachable, 1) // a PoP always reaches its own region
	if perRegion > 0 {
		return min(1, float64(reachable)*perRegion)
	}
	return float64(reachable) / float64(total)
}
