package backoff_test

import (
	"fmt"
	"time"

	"github.com/inmesh/inmesh/backoff"
)

func ExamplePolicy_Delay() {
	p := backoff.Policy{Min: 100 * time.Millisecond, Max: time.Second}
	for attempt := range 6 {
		fmt.Println(attempt, p.Delay(attempt))
	}
	// Output:
	// 0 100ms
	// 1 200ms
	// 2 400ms
	// 3 800ms
	// 4 1s
	// 5 1s
}

func ExampleFromLookup() {
	env := map[string]string{"INMESH_CONTROL_BACKOFF_DELAY": "250ms"}
	p, err := backoff.FromLookup("INMESH_CONTROL", backoff.DefaultPolicy(), func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	})
	fmt.Println(p.Min, p.Max, err)

	env = map[string]string{"INMESH_CONTROL_EXP_BACKOFF_MIN": "1s"}
	_, err = backoff.FromLookup("INMESH_CONTROL", backoff.DefaultPolicy(), func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	})
	fmt.Println(err)
	// Output:
	// 250ms 250ms <nil>
	// backoff: INMESH_CONTROL_EXP_BACKOFF_MAX is required when INMESH_CONTROL_EXP_BACKOFF_MIN or INMESH_CONTROL_EXP_BACKOFF_JITTER is set
}
