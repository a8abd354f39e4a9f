package lab

import (
	"bytes"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ip runs the ip command and returns its error with its output.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// Link names in the root namespace: region i's wan and mgmt uplinks, and
// the veth of host j of region i while it is being moved.
func wanLink(i int) string          { return fmt.Sprintf("%s%dw", Prefix, i) }
func mgmtLink(i int) string         { return fmt.Sprintf("%s%dm", Prefix, i) }
func hostLink(i, j int) string      { return fmt.Sprintf("%s%dh%d", Prefix, i, j) }
func gatewayNS(r RegionPlan) string { return Prefix + "-gw-" + r.Name }

// wanTable is the routing table (and the rule's preference) that sends the
// replies of region i's relays back over its wan link.
func wanTable(i int) int { return 21300 + i }

// setupNetwork makes every namespace, bridge, veth pair, address and route
// of p (see the package doc). On error, the caller tears down.
func setupNetwork(p Plan) error {
	for _, r := range p.Regions {
		gw := gatewayNS(r)
		steps := [][]string{
			{"netns", "add", gw},
			{"-n", gw, "link", "set", "lo", "up"},
			{"-n", gw, "link", "add", "br0", "type", "bridge"},
			{"-n", gw, "addr", "add", gwIP(r.Index) + "/24", "dev", "br0"},
			{"-n", gw, "link", "set", "br0", "up"},
		}
		for _, up := range []struct {
			root, gw string
			addr     func(int, bool) string
		}{{wanLink(r.Index), "wan0", wanIP}, {mgmtLink(r.Index), "mgmt0", mgmtIP}} {
			steps = append(steps,
				[]string{"link", "add", up.root, "type", "veth", "peer", "name", up.root + "g"},
				[]string{"link", "set", up.root + "g", "netns", gw},
				[]string{"-n", gw, "link", "set", up.root + "g", "name", up.gw},
				[]string{"-n", gw, "addr", "add", up.addr(r.Index, true) + "/30", "dev", up.gw},
				[]string{"-n", gw, "link", "set", up.gw, "up"},
				[]string{"addr", "add", up.addr(r.Index, false) + "/30", "dev", up.root},
				[]string{"link", "set", up.root, "up"},
			)
		}
		steps = append(steps,
			[]string{"route", "replace", subnet(r.Index), "via", mgmtIP(r.Index, true)},
			[]string{"rule", "add", "from", wanIP(r.Index, false), "lookup", strconv.Itoa(wanTable(r.Index)), "pref", strconv.Itoa(wanTable(r.Index))},
			wanRoute(r),
		)
		for j, h := range append(append(append([]Host{}, r.NATS...), r.PoPs...), r.Redis...) {
			l := hostLink(r.Index, j)
			steps = append(steps,
				[]string{"netns", "add", h.NS},
				[]string{"-n", h.NS, "link", "set", "lo", "up"},
				[]string{"link", "add", l, "type", "veth", "peer", "name", l + "b"},
				[]string{"link", "set", l, "netns", h.NS},
				[]string{"-n", h.NS, "link", "set", l, "name", "eth0"},
				[]string{"-n", h.NS, "addr", "add", h.IP + "/24", "dev", "eth0"},
				[]string{"-n", h.NS, "link", "set", "eth0", "up"},
				[]string{"-n", h.NS, "route", "add", "default", "via", gwIP(r.Index)},
				[]string{"link", "set", l + "b", "netns", gw},
				[]string{"-n", gw, "link", "set", l + "b", "master", "br0"},
				[]string{"-n", gw, "link", "set", l + "b", "up"},
			)
		}
		for _, s := range steps {
			if err := ip(s...); err != nil {
				return err
			}
		}
		// The gateway routes between its bridge and its uplinks; the root
		// namespace does not forward, so regions reach each other only
		// through the relays.
		if out, err := exec.Command("ip", "netns", "exec", gw, "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
			return fmt.Errorf("ip_forward in %s: %v: %s", gw, err, out)
		}
	}
	return nil
}

// wanRoute is the route of region r's relay replies over its wan link; a
// link taken down loses it, so a heal adds it again.
func wanRoute(r RegionPlan) []string {
	return []string{"route", "replace", subnet(r.Index), "via", wanIP(r.Index, true), "dev", wanLink(r.Index), "table", strconv.Itoa(wanTable(r.Index))}
}

// cut takes region r's wan link down: its relays' connections stall as on
// a failed link (nothing is closed; TCP retransmits until the heal).
func cut(r RegionPlan) error { return ip("link", "set", wanLink(r.Index), "down") }

// heal brings region r's wan link back, with its route.
func heal(r RegionPlan) error {
	if err := ip("link", "set", wanLink(r.Index), "up"); err != nil {
		return err
	}
	return ip(wanRoute(r)...)
}

// Leftovers lists what a lab left behind: namespaces, root links, rules and
// processes inside the namespaces. Empty means clean.
func Leftovers() []string {
	var out []string
	for _, ns := range namespaces() {
		out = append(out, "netns "+ns)
		for _, pid := range nsPids(ns) {
			out = append(out, fmt.Sprintf("process %d in %s", pid, ns))
		}
	}
	for _, l := range rootLinks() {
		out = append(out, "link "+l)
	}
	for _, pref := range ipRules() {
		out = append(out, fmt.Sprintf("ip rule pref %d", pref))
	}
	return out
}

// Teardown removes everything a lab made: it kills the processes left in
// its namespaces (SIGKILL, by pid), deletes the namespaces (their veths go
// with them), the root links and the rules. It returns what it could not
// remove.
func Teardown() error {
	var errs []string
	for _, ns := range namespaces() {
		for _, pid := range nsPids(ns) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if err := ip("netns", "del", ns); err != nil {
			errs = append(errs, err.Error())
		}
	}
	// A deleted namespace takes its veths' peers along, but not at once.
	for try := 0; try < 50 && len(rootLinks()) > 0; try++ {
		time.Sleep(20 * time.Millisecond)
	}
	for _, l := range rootLinks() {
		if err := ip("link", "del", l); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
			errs = append(errs, err.Error())
		}
	}
	for _, pref := range ipRules() {
		if err := ip("rule", "del", "pref", strconv.Itoa(pref)); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("lab teardown: %s", strings.Join(errs, "; "))
	}
	return nil
}

// namespaces lists the network namespaces named with Prefix.
func namespaces() []string {
	out, _ := exec.Command("ip", "netns", "list").Output()
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], Prefix+"-") {
			names = append(names, f[0])
		}
	}
	return names
}

// nsPids lists the processes running in namespace ns.
func nsPids(ns string) []int {
	out, _ := exec.Command("ip", "netns", "pids", ns).Output()
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// rootLinks lists the root namespace's links named with Prefix.
func rootLinks() []string {
	out, _ := exec.Command("ip", "-o", "link", "show").Output()
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if strings.HasPrefix(name, Prefix) {
			names = append(names, name)
		}
	}
	return names
}

// ipRules lists the preferences of the lab's ip rules (wanTable's range).
func ipRules() []int {
	out, _ := exec.Command("ip", "rule", "list").Output()
	var prefs []int
	for _, line := range strings.Split(string(out), "\n") {
		p, _, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		if n, err := strconv.Atoi(strings.TrimSpace(p)); err == nil && n > wanTable(0) && n <= wanTable(250) {
			prefs = append(prefs, n)
		}
	}
	return prefs
}
