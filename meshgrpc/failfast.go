package meshgrpc

import (
	"fmt"
)

// failFastPrefix begins the text of every fail-fast error of the picker.
const failFastPrefix = "meshgrpc: failing fast: "

// newFailFastError is the picker's answer to a call of a backend in
// failfast (no endpoint of it in rotation within its failfast timeout;
// empty: its endpoint set is empty), naming the last connection error of
// its endpoints when they failed to connect. It is not a status: grpc-go
// ends a fail-fast call with a picker's plain error, as UNAVAILABLE with
// its text, and keeps a wait-for-ready call waiting for the next picker,
// where a status error would end both.
func newFailFastError(bp pickPool, backend string, empty bool) error {
	if empty {
		return fmt.Errorf("%sno endpoints for %s within %s", failFastPrefix, backend, bp.pool.FailFast())
	}
	if bp.lastErr != nil {
		return fmt.Errorf("%sno endpoint of %s ready within %s (last connection error: %v)",
			failFastPrefix, backend, bp.pool.FailFast(), bp.lastErr)
	}
	return fmt.Errorf("%sno endpoint of %s ready within %s", failFastPrefix, backend, bp.pool.FailFast())
}
