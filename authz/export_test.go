package authz

import "time"

// WithClock sets the clock of the rate limits, for tests.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) { c.now = now })
}
