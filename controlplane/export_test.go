package controlplane

// SetBoundHook makes f run in each registration's handler after it
// subscribed to its binding; the returned function removes it.
func SetBoundHook(f func()) (restore func()) {
	boundHook.Store(&f)
	return func() { boundHook.Store(nil) }
}
