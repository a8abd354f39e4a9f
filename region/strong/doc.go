// Package strong is the pure core of `consistency: strong`: one home decides
// every check of a key, exactly, and every other PoP asks it and waits one
// round trip.
//
// The package is pure: it reads no clock, does no IO, starts no goroutines
// and holds no randomness. Instants and durations are arguments (unix
// nanoseconds, nanoseconds); messages are values it encodes, decodes and
// checks. Its one stateful type, RTT, is not safe for concurrent use. It
// imports the standard library and region (the partition share).
//
// # Home
//
// A key's home region is Pick(key, regions), the regions that serve the
// limit sorted by name: a region limit's own region, every region for a
// global one. Within the home region one PoP decides, Pick(key, its PoPs
// sorted): the PoPs of a region keep separate stores, so two deciders would
// hold two counters and each admit the whole limit. Every PoP computes the
// same home from the same topology, with no message exchanged. A home named
// in the configuration replaces the hash.
//
// # The decision
//
// The home decides on one counter of its own, with the limit's algorithm,
// so the limit holds as one central store would hold it; a checking PoP
// outside it sends a Request (key, spec, hits) and applies the Reply, after
// CheckReply has held it to the request (same id and key, remaining within
// the limit, times within the window).
//
// The home decides every check, its own and those it is asked, at the
// limit as configured, never at the share an asker holds while it finds
// regions cut off (that share is what the asker may admit without the
// home); for a global limit the home applies its own share once its own
// replication core finds regions cut off, as it holds every global limit.
//
// The home's clock is the PoP's, with the correction the PoPs agree on;
// when the correction steps it forward across a window boundary, the hits
// the home admitted just before the step fall, by the new clock, in the
// new window, and are counted there too (pop/store's Strong.MoveClock):
// left in the window before, a sliding count would forget them as the new
// window slides and admit them again.
//
// # When the home does not answer
//
// A PoP waits RTT.Timeout for a reply: the smoothed round trip plus four
// times its deviation (RFC 6298's SRTT + 4·RTTVAR, gains 1/8 and 1/4), never
// less than a floor that covers a busy home's scheduling. Past it, or when
// the home cannot be reached at all, Unreachable applies the limit's own
// partition policy, the one every region or global limit follows: a
// fail_closed limit denies; any other is decided on the PoP's local
// knowledge as an eventual limit of its scope: every PoP also counts the
// strong admissions it served in its replicated counts, so a PoP cut off
// from the home knows the window up to the cut. A global limit is then
// held to the partition share (region.Share): the share the replication
// core sets once it sees the cut, and LocalShare before.
package strong
