package pop

// SetCountDenied makes pop-scope limits count the hits of denied requests
// too, as Envoy's ratelimit counts every hit (INCRBY before it compares): a
// client that keeps sending while over stays over, and a request denied by one
// limit still spends the others it matched. Off by default: a denied request
// spends nothing. Region and global limits never count denied hits: their
// counts replicate, and a receiver rejects a count no PoP could have admitted.
// Checks that only peek (hits_addend 0) count nothing either way.
func (e *Engine) SetCountDenied(on bool) { e.countDenied.Store(on) }
