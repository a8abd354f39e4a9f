// Package escrow is the pure core of `consistency: bounded`: the bookkeeping
// and the decision that keep a region or global limit from ever admitting
// more than its limit, by construction, whatever the network does — loss,
// duplication, reordering, partitions, restarts.
//
// Every replica (PoP) of the limit's scope admits only within an allowance it
// holds, and the allowances of one (key, window) never sum past the limit.
// Unused allowance moves toward demand (escrow, or the demarcation protocol
// of Barbará and Garcia-Molina, 1992), in proportion to demand (Raghavan et
// al., SIGCOMM 2007, flow proportional share; Doorman's PROPORTIONAL_SHARE).
//
// The package is pure: it reads no clock, does no IO, starts no goroutines
// and holds no package-level randomness. Every instant is an argument (unix
// nanoseconds), every message an argument, every output a returned value. It
// imports the standard library and crdt only. Its one stateful type, Ledger,
// is not safe for concurrent use.
//
// # Units and replicas
//
// An allowance is a fraction of the limit, held as an integer number of
// units of 1/Scale of it (Scale = 2²⁰ by default), so that it travels as a
// CRDT counter. The scope's replicas R are a sorted list of N names (a
// region's PoPs for a region limit, every PoP for a global one), the same at
// every replica.
//
// Windows are epoch-aligned: window w of a key with window length W starts
// at a multiple of W (unix ns). For every (key, w):
//
//   - Start share. Every replica starts w with s = ⌊Scale/N⌋; the remainder
//     Scale − N·s goes to the first replica, so that the start shares sum to
//     exactly Scale. A replica whose incarnation (Config.Incarnation, the
//     instant its process started) began after w did starts w with 0 — see
//     Crash.
//
//   - Gives. give(j→k, w) is an absolute counter owned by the giver j, in
//     units, that only grows. Replica i's fraction of w is
//
//     f_i(w) = start_i(w) + Σ_j give(j→i, w) − Σ_k give(i→k, w)
//
//     Its own out-gives i knows exactly; its in-gives are what it has heard,
//     a lower bound. So the fraction a replica decides on is never more than
//     it truly holds, and a give in flight belongs to no one.
//
//   - Counters. Each replica publishes, per (key, w), its count C_i(w) (hits
//     admitted), its requested hits R_i(w) (admitted and denied: its demand)
//     and its gives, each absolute. Receivers keep the largest value per
//     counter, so duplicated, reordered and replayed messages are harmless.
//
// # The invariant
//
// Σ_i f_i(w) ≤ Scale for every (key, w), at every instant, counting gives in
// flight as held by no one: a give enters the giver's state (lowering its
// fraction) before it is published, so the receiver can add only what the
// giver has already subtracted. A replica never gives below what its
// admissions of the window need. Then, for the fixed window, replica i admits
// h hits at now in window w iff
//
//	C_i(w) + h ≤ f_i(w)·L/Scale
//
// and Σ_i C_i(w) ≤ Σ_i f_i(w)·L/Scale ≤ L.
//
// For the sliding window, whose count at elapsed fraction e of w is
// P·(1−e) + C (P the previous window's total, C the current one's), i admits
// iff
//
//	C_i(w) + h ≤ f_i(w)/Scale · (L − P̂·(1−e))
//
// with P̂ an upper bound of P. Then Σ_i C_i(w) ≤ L − P̂(1−e) ≤ L − P(1−e) at
// every instant: the sliding count never passes L. (The room only grows with
// e, so an admission made earlier in the window stays within it; e is
// rounded down to 2⁻¹⁶ of the window, which only lowers the room.)
//
// # P̂: the previous window, bounded from above
//
// The counts heard of w−1 are a lower bound of P (some may still be in
// flight); P̂ must be an upper bound. Replica k's count of w−1 is final at i
// once i has applied news from k sent at or after the end of w−1 — every
// message, empty flushes and beacons included, carries a watermark (News):
// "everything I admitted and gave up to my time SentAt is in what I have
// published" — and k's incarnation began no later than w−1 did. Own counts
// are final, except in a window that began before this incarnation. Then
//
//	P̂ = Σ_final P_k + min(L − Σ_final P_k, ⌈L·(Scale − Σ_final f̲_k(w−1))/Scale⌉)
//
// where f̲_k(w−1) = start_k + gives heard to k − k's out-gives, clamped at 0.
// It is a lower bound of k's fraction of w−1, exact in its out-gives because
// a final k's watermark covers every give it made for w−1 (gives of w−1 are
// made before w−1 ends). The replicas not final held together at most
// Scale − Σ_final f_k ≤ Scale − Σ_final f̲_k, so they admitted at most that
// much of L; and Σ_k P_k ≤ L since w−1 was bounded too. Before a replica is
// heard from after a boundary, P̂ counts its whole fraction of w−1: the
// sliding window is pessimistic for about one flush plus one delay after
// each boundary, and only when the replicas not yet heard held allowance.
//
// # Moving allowance (Rebalance)
//
// Each flush the driver calls Rebalance(now). Replica i estimates every
// replica's demand for each key from the R counters it has heard, sets
// demand-proportional targets target_k = Scale·d_k/Σd (0 without demand),
// and, if it holds more than its target plus a band, gives its unused excess
// to the replicas most below their targets in proportion to their deficits
// (Ledger.Rebalance states the estimator, the band and the smallest give).
// It gives for the current window w, within what it has not used — for the
// fixed window used_i = ⌈C_i·Scale/L⌉, for the sliding window
// ⌈C_i·Scale/(L − P̂(1−e))⌉ — and for w+1 before it starts (a pre-give),
// keeping only its own target: usage of w+1 is 0 before it starts, so a
// pre-give is always within what the giver has unused. A client pinned to
// one replica thus starts each window with most of the limit there, not
// 1/N of it. Only givers act; nobody takes.
//
// # Crash
//
// A replica cannot know what it admitted between its last saved flush and a
// crash. A restarted replica (a new Config.Incarnation) therefore treats
// every window that began before its incarnation — every window that
// overlaps its down time or the restart — as if its previous incarnation
// were a separate replica that used everything it held:
//
//  1. its start share of such a window is 0;
//  2. only gives addressed to its new incarnation count: a giver tags every
//     give with the receiver's incarnation as heard (Item.ToIncarnation), and
//     gives to an earlier incarnation stay with that incarnation. A start
//     share of 0 alone is not enough: the previous incarnation may have used
//     gives it received and then crashed before publishing the count, and
//     hearing those gives again after the restart would let it use them
//     twice;
//  3. its own count and out-gives of such a window as restored (or relayed
//     back) when it starts deciding are the previous incarnation's: they
//     neither count against what the new incarnation is given nor add to it.
//
// Windows that begin after the restart start as usual, with the out-gives
// (pre-gives) restored from disk subtracted. So a restart costs the
// allowance the previous incarnation held of the windows from the one it
// crashed in to the one it restarted in, and in the latter the restarted
// replica asks for allowance like a newcomer. Other replicas learn the new
// incarnation from its news, and take its count of such windows as not final
// when they compute P̂.
//
// The restored state does not change this rule; it keeps the published
// counters monotone (a replica never publishes a lower value than before).
//
// # Partition
//
// A replica cut off from the others keeps what it holds of the current
// window (safety), and others cannot use it; gives to it are stranded with
// it. Every window starts from the start shares again, so nothing is stuck
// longer than the window it was given for. The cost: while cut off, its
// start share of every window (1/N of the limit), plus what it was pre-given
// before the cut, is unusable by the others, and it can admit only that
// share itself. A replica not heard from for a whole window gets no gives.
// Leases are not needed for safety here, since allowances are per window and
// expire with it.
//
// # Clocks
//
// Replicas decide on their own clocks, which the PoPs keep agreed within a
// few milliseconds; δ is the largest offset of any replica's clock from a
// reference clock. Skew shifts each replica's windows by its offset. The
// invariant on fractions does not involve time, and the fixed window's bound
// holds exactly per window as the replicas label their hits. For the sliding
// window, a replica's elapsed fraction is at most δ/W ahead of the
// reference's, so at every reference instant the sliding count of the
// replicas' labelled hits is at most L + P·δ/W (δ = 5 ms, W = 1 s: half a
// percent of the previous window). Measured on the reference clock instead
// of the labels, a window may also take hits admitted within δ of its
// boundaries under the neighbouring label. Finality compares the sender's
// watermark with the sender's own window ends, so it does not depend on
// skew. A replica's clock must not go back across its own restart (its new
// incarnation must be later than anything its previous one published).
//
// # What the driver does (the caller's contract)
//
//  1. On start, New with Config.Incarnation = the process start time, then
//     Restore with the own items it saved, before the first Decide or
//     Rebalance.
//  2. On every check, Decide(now, key, spec, hits). A request that other
//     limits decide too peeks first with Decide(now, key, spec, 0), then
//     calls Decide(now, key, spec, hits) if the whole request is admitted,
//     or Request(now, key, spec, hits) if it is not, so that its hits are
//     counted (C) only where the request got them, and as demand (R)
//     everywhere (see Decide).
//  3. Every flush: Rebalance(now), then Delta(now). Save the items — the gives
//     at least — durably, and only then publish them with the returned News.
//     A failed save publishes nothing (publish Own later). Publish the News
//     even when there are no items: it is the watermark others' P̂ waits on.
//     Flush early too (a Rebalance and a Delta, as at a flush) when Wanted
//     reports true after an Apply: this replica heard demand it holds
//     allowance for, and the asker may run out before the next flush.
//  4. On every message from replica k: Apply(news, items). The watermark is
//     true only if every item k published up to news.SentAt has been applied
//     by then: apply k's messages in order without gaps (a stream), or send
//     full snapshots (Own) on a transport that may lose or reorder.
//  5. Prune(now) once a window, dropping windows older than the previous one.
//  6. On the wire, EncodeSlot and DecodeSlot map items onto crdt.Slot: the
//     slot's Replica is the item's owner (a plain PoP name, so a replica's
//     items travel in its own batches like its counts), and its Key is a
//     header — the two bytes 0x00 0xE5, then kind, spec and, for a give, the
//     receiver — followed by the limit key. No limit key begins with 0x00
//     (see EncodeSlot). Route every slot for which IsSlot holds to the
//     Ledger before anything reads its Key as a limit key: never into the
//     sums of ordinary counts, nor into the receiver's count bounds.
//
// # Not here
//
// A region holding a fraction of a global limit and splitting it among its
// PoPs (Doorman's server tree); a learned prior for a key's first window
// (every key starts at equal shares); leases; a change of a scope's replica
// set while its windows are live (every replica must use the same set for a
// window); and sparse state for scopes of many replicas (an entry costs O(N)
// per (key, window)).
package escrow
