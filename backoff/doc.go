// Package backoff holds the delay policy that every reconnect loop in inmesh
// uses, and the pieces built on it: a [Sequence] of delays, a [Dialer] that
// waits between failed dials, a [Retry] loop for long-lived streams, and
// parsing of a policy from environment variables.
//
// A [Policy] is plain data. Its delay for attempt n is Min·2ⁿ capped at Max,
// plus jitter that only adds time and never passes Max: the exponential
// backoff of Linkerd's proxy. A fixed delay d is Policy{Min: d, Max: d}.
//
// Every wait happens on a timer that the waiting goroutine owns and blocks
// on, and ends at once when its context is cancelled: nothing in this
// package waits on a timer that nobody polls, and nothing spins.
package backoff
