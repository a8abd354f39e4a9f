package region

import "slices"

// Member reports whether the topology names pop as a PoP of region. A
// receiver takes messages only from members: a replica outside the topology,
// or one that names another region than its own, is no PoP of the deployment
// (replication/core rejects it). The zero Topology has no members.
func (t Topology) Member(region, pop string) bool {
	return slices.Contains(t.Regions[region], pop)
}
