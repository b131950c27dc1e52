package backoff

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// defaultPolicy is what DefaultPolicy returns.
var defaultPolicy = Policy{Min: 100 * time.Millisecond, Max: 10 * time.Second, Jitter: 0.1}

// DefaultPolicy returns the policy used where a zero [Policy] is given:
// Linkerd's defaults for a connection to a control plane on the same host
// (100ms to 10s, jitter 0.1).
func DefaultPolicy() Policy { return defaultPolicy }

// Policy describes exponential backoff with jitter.
//
// The zero Policy means [DefaultPolicy]. A Policy is a value; it is safe for
// concurrent use.
type Policy struct {
	// Min is the delay before the first retry (attempt 0). It must be
	// positive: a zero minimum would make every delay zero.
	Min time.Duration
	// Max bounds every delay, jitter included. It must be positive and at
	// least Min.
	Max time.Duration
	// Jitter is the largest fraction of the exponential delay added at
	// random: 0.1 adds up to 10%. It must be finite and in [0, 100].
	Jitter float64
}

// Fixed returns the policy that always waits d. A d that is not positive is
// an error: a zero delay would retry in a tight loop, and the zero Policy
// already means [DefaultPolicy].
func Fixed(d time.Duration) (Policy, error) {
	if d <= 0 {
		return Policy{}, fmt.Errorf("backoff: fixed delay %v must be positive", d)
	}
	return Policy{Min: d, Max: d}, nil
}

func (p Policy) orDefault() Policy {
	if p == (Policy{}) {
		return defaultPolicy
	}
	return p
}

// Validate reports whether the policy can be used: Min positive, Max at
// least Min, Jitter finite in [0, 100]. The zero Policy is valid (it means
// [DefaultPolicy]).
func (p Policy) Validate() error {
	p = p.orDefault()
	switch {
	case p.Min <= 0:
		return fmt.Errorf("backoff: min %v must be positive", p.Min)
	case p.Max <= 0:
		return fmt.Errorf("backoff: max %v must be positive", p.Max)
	case p.Min > p.Max:
		return fmt.Errorf("backoff: min %v is greater than max %v", p.Min, p.Max)
	case math.IsNaN(p.Jitter) || math.IsInf(p.Jitter, 0):
		return errors.New("backoff: jitter must be finite")
	case p.Jitter < 0 || p.Jitter > 100:
		return fmt.Errorf("backoff: jitter %v is outside [0, 100]", p.Jitter)
	}
	return nil
}

// Delay returns the delay before retry number attempt, counting from 0. It
// never exceeds Max and is never below the exponential base Min·2ⁿ (capped at
// Max). A negative attempt counts as 0. An invalid policy (see
// [Policy.Validate]) is clamped into range rather than trusted: a Min or Max
// that is not positive takes [DefaultPolicy]'s, so no delay is ever zero.
func (p Policy) Delay(attempt int) time.Duration {
	return p.delay(attempt, rand.Float64())
}

// delay is Delay with the uniform random value u in [0, 1) given, so that it
// is a pure function.
func (p Policy) delay(attempt int, u float64) time.Duration {
	p = p.orDefault()
	// An invalid policy must not spin: a missing bound takes the default.
	if p.Max <= 0 {
		p.Max = defaultPolicy.Max
	}
	minD := p.Min
	if minD <= 0 {
		minD = defaultPolicy.Min
	}
	minD = min(minD, p.Max)
	if attempt < 0 {
		attempt = 0
	}
	base := p.Max
	if attempt < 63 && minD <= p.Max>>uint(attempt) {
		base = minD << uint(attempt)
	}
	jitter := p.Jitter
	if !(jitter > 0) || math.IsInf(jitter, 0) { // NaN and negatives add nothing
		return base
	}
	extra := float64(base) * min(jitter, 100) * u
	if room := float64(p.Max - base); extra > room {
		extra = room
	}
	return base + time.Duration(extra)
}

// Sequence hands out the delays of a Policy one attempt after another. It is
// not safe for concurrent use.
type Sequence struct {
	policy  Policy
	attempt int
}

// NewSequence returns a Sequence at attempt 0.
func NewSequence(p Policy) *Sequence { return &Sequence{policy: p} }

// Next returns the delay for the current attempt and moves to the next one.
func (s *Sequence) Next() time.Duration {
	d := s.policy.Delay(s.attempt)
	if s.attempt < math.MaxInt {
		s.attempt++
	}
	return d
}

// Attempt returns how many delays Next has handed out since the last Reset.
func (s *Sequence) Attempt() int { return s.attempt }

// Reset starts the sequence again from attempt 0, as after a success.
func (s *Sequence) Reset() { s.attempt = 0 }
