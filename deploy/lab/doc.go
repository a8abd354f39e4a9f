// Package lab runs edgelimit as real sites on one Linux machine: N regions ×
// M PoPs, every NATS server and every PoP a separate host in its own network
// namespace, started from the very files an operator deploys
// (deploy/nats/*.conf, deploy/systemd/pop.yaml), with the network between
// regions — latency, jitter, loss, cuts — read from an `edgelimit sim`
// scenario file, so the lab and the simulator run the same scenario and
// their results can be set side by side.
//
// The network (see Plan and network.go): each region is a bridge in a
// gateway namespace, its hosts hang off the bridge by veth pairs, and the
// gateway reaches the root namespace by two uplinks: "wan", which only the
// relays use, and "mgmt", which the lab uses to start, probe and scrape.
// Hosts of different regions have no IP route to each other; every
// connection between regions — the leaf links from each region's NATS
// servers to the hub region's — crosses a faultnet.Proxy in the root
// namespace that delays, jitters and loses as the scenario's link says (the
// kernel here has no netem, nor iptables). A region is cut by taking its
// wan link down, so the lab can still watch it.
//
// A scenario with direct: true (the lab's -direct) also gives every PoP the
// direct paths of `edgelimit pop --nats-direct`: for each server of every
// other region a relay of the PoP's own (Plan.Direct), listening on its
// region's wan side and dialing that server's client port from the other
// region's wan address, with the link between the two regions, so that each
// PoP's connection to a region is a stream of its own that loses and stalls
// on its own, as the simulator's direct path does; a cut of either region
// cuts it. The simulator run beside it then has direct: true too.
//
// Run needs root (ip netns), and tears down everything it made — also on
// error and on interrupt — and, before it starts, whatever an earlier run
// left behind (everything named with Prefix).
//
// It may import anything; nothing imports it but its command and test.
package lab
