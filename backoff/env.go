package backoff

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// FromEnv reads a policy from the environment, with Linkerd's variable names
// under prefix (for example "INMESH_CONTROL"):
//
//	<PREFIX>_EXP_BACKOFF_MIN, <PREFIX>_EXP_BACKOFF_MAX, <PREFIX>_EXP_BACKOFF_JITTER
//	<PREFIX>_BACKOFF_DELAY   a fixed delay
//
// Values are Go durations ("100ms", "5s") and, for the jitter, a number. The
// exponential variables go all three or none; MIN and MAX without JITTER
// mean no jitter; any other partial set is an error. The fixed delay may not
// be combined with them. With none of them set, FromEnv returns def. Every
// error names the variable.
func FromEnv(prefix string, def Policy) (Policy, error) {
	return FromLookup(prefix, def, os.LookupEnv)
}

// FromLookup is [FromEnv] with the variables read through lookup.
func FromLookup(prefix string, def Policy, lookup func(string) (string, bool)) (Policy, error) {
	get := func(suffix string) (name, value string, ok bool) {
		name = prefix + suffix
		value, ok = lookup(name)
		return name, strings.TrimSpace(value), ok
	}
	minName, minVal, hasMin := get("_EXP_BACKOFF_MIN")
	maxName, maxVal, hasMax := get("_EXP_BACKOFF_MAX")
	jitName, jitVal, hasJit := get("_EXP_BACKOFF_JITTER")
	fixName, fixVal, hasFix := get("_BACKOFF_DELAY")

	if hasFix {
		if hasMin || hasMax || hasJit {
			return Policy{}, fmt.Errorf("backoff: %s cannot be combined with %s_EXP_BACKOFF_*", fixName, prefix)
		}
		d, err := parseDuration(fixName, fixVal)
		if err != nil {
			return Policy{}, err
		}
		p, err := Fixed(d)
		if err != nil {
			return Policy{}, fmt.Errorf("backoff: %s must be positive", fixName)
		}
		return p, nil
	}
	if !hasMin && !hasMax && !hasJit {
		return def, nil
	}
	switch {
	case !hasMin:
		return Policy{}, fmt.Errorf("backoff: %s is required when %s or %s is set", minName, maxName, jitName)
	case !hasMax:
		return Policy{}, fmt.Errorf("backoff: %s is required when %s or %s is set", maxName, minName, jitName)
	}
	var p Policy
	var err error
	if p.Min, err = parseDuration(minName, minVal); err != nil {
		return Policy{}, err
	}
	if p.Max, err = parseDuration(maxName, maxVal); err != nil {
		return Policy{}, err
	}
	if hasJit {
		p.Jitter, err = strconv.ParseFloat(jitVal, 64)
		if err != nil {
			return Policy{}, fmt.Errorf("backoff: %s=%q is not a number", jitName, jitVal)
		}
	}
	// Checked here, by name: a zero Policy would otherwise read as the
	// default, and Validate's errors do not know the variables.
	if p.Min == 0 {
		return Policy{}, fmt.Errorf("backoff: %s must be positive", minName)
	}
	if p.Max == 0 {
		return Policy{}, fmt.Errorf("backoff: %s must be positive", maxName)
	}
	if p.Min > p.Max {
		return Policy{}, fmt.Errorf("backoff: %s (%v) is greater than %s (%v)", minName, p.Min, maxName, p.Max)
	}
	if err := p.Validate(); err != nil {
		return Policy{}, fmt.Errorf("%s: %w", jitName, err)
	}
	return p, nil
}

func parseDuration(name, value string) (time.Duration, error) {
	d, err := time.ParseDuration(value)
	if err != nil {
		return 0, fmt.Errorf("backoff: %s=%q is not a duration (like 100ms or 5s)", name, value)
	}
	if d < 0 {
		return 0, fmt.Errorf("backoff: %s=%q is negative", name, value)
	}
	return d, nil
}
