package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/inmesh/inmesh/internal/filestamp"
	"github.com/inmesh/inmesh/internal/ratelog"
)

// WatchFiles loads the ServiceProfile YAML files (*.yaml, *.yml) of
// profilesDir and the endpoints file into store, then checks them every
// interval (default 1s when interval <= 0) and loads again what changed,
// until ctx is done. Either path may be empty. Of the package's options it
// uses [WithLogger] and [WithLogInterval].
//
// A changed file is loaded once it stayed the same for one interval, so that
// a copy caught half-way is not loaded; a file that changes while it is read
// is read again at the next poll. A file that fails to load (bad YAML, a
// duplicate key, a bad field, an empty or truncated file) is logged with its
// file, document and field, and the store keeps serving the last good
// version. WatchFiles returns the error of the first load, without
// watching, when it fails.
func WatchFiles(ctx context.Context, store *Store, profilesDir, endpointsFile string, interval time.Duration, opts ...Option) error {
	cfg := newConfig(opts)
	if interval <= 0 {
		interval = time.Second
	}
	w := &fileWatcher{store: store, dir: profilesDir, endpoints: endpointsFile,
		log: ratelog.New(cfg.logger, cfg.logInterval)}
	if err := w.load(true); err != nil {
		return err
	}
	go w.run(ctx, interval)
	return nil
}

type fileWatcher struct {
	store                           *Store
	dir, endpoints                  string
	manifests                       string
	log                             *ratelog.Logger
	profilesSettle, endpointsSettle filestamp.Settle
	manifestsSettle                 filestamp.Settle
}

func (w *fileWatcher) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := w.load(false); err != nil {
				w.log.WarnErr("rejected file", "rejected a control-plane file; serving the last good version", err)
			}
		}
	}
}

// load reads what changed; first loads everything at once.
func (w *fileWatcher) load(first bool) error {
	var errs []string
	if w.dir != "" {
		paths, stamp, err := filestamp.YAMLFiles(w.dir)
		switch {
		case err != nil:
			errs = append(errs, err.Error())
		case first || w.profilesSettle.Ready(stamp):
			err := w.store.LoadServiceProfiles(paths...)
			switch {
			case errors.Is(err, filestamp.ErrChanged):
				// Not recorded: read again at the next poll.
				w.log.Debug("file changed", "a file changed while it was read", "error", err)
			case err != nil:
				w.profilesSettle.Loaded(stamp)
				errs = append(errs, err.Error())
			default:
				w.profilesSettle.Loaded(stamp)
				if !first {
					w.log.Info("loaded profiles", "loaded service profiles", "dir", w.dir, "files", len(paths))
				}
				for _, err := range w.store.ProfileNameProblems() {
					w.log.WarnErr("profile name", "a loaded ServiceProfile will never apply", err, "dir", w.dir)
				}
			}
		}
	}
	if w.endpoints != "" {
		stamp, err := filestamp.File(w.endpoints)
		switch {
		case err != nil:
			errs = append(errs, err.Error())
		case first || w.endpointsSettle.Ready(stamp):
			err := w.store.LoadEndpoints(w.endpoints)
			switch {
			case errors.Is(err, filestamp.ErrChanged):
				w.log.Debug("file changed", "a file changed while it was read", "error", err)
			case err != nil:
				w.endpointsSettle.Loaded(stamp)
				errs = append(errs, err.Error())
			default:
				w.endpointsSettle.Loaded(stamp)
				if !first {
					w.log.Info("loaded endpoints", "loaded endpoints", "file", w.endpoints)
				}
			}
		}
	}
	if w.manifests != "" {
		paths, stamp, err := filestamp.YAMLFiles(w.manifests)
		switch {
		case err != nil:
			errs = append(errs, err.Error())
		case first || w.manifestsSettle.Ready(stamp):
			err := w.store.LoadManifests(paths...)
			switch {
			case errors.Is(err, filestamp.ErrChanged):
				w.log.Debug("file changed", "a file changed while it was read", "error", err)
			case err != nil:
				w.manifestsSettle.Loaded(stamp)
				errs = append(errs, err.Error())
			default:
				w.manifestsSettle.Loaded(stamp)
				if !first {
					w.log.Info("loaded manifests", "loaded policy manifests", "dir", w.manifests, "files", len(paths))
				}
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// WatchManifestFiles loads the Service, HTTPRoute and GRPCRoute manifests
// (*.yaml, *.yml) of dir into store for the OutboundPolicies API, then
// checks them every interval (default 1s when interval <= 0) and loads them
// again when any changed, until ctx is done, with the semantics of
// [WatchFiles]: a change is loaded once it settled for one interval; a bad
// file is logged with its file, document and field, and the store keeps
// serving the last good version. Of the package's options it uses
// [WithLogger] and [WithLogInterval]. The error of the first load is
// returned, without watching.
func WatchManifestFiles(ctx context.Context, store *Store, dir string, interval time.Duration, opts ...Option) error {
	cfg := newConfig(opts)
	if interval <= 0 {
		interval = time.Second
	}
	w := &fileWatcher{store: store, manifests: dir, log: ratelog.New(cfg.logger, cfg.logInterval)}
	if err := w.load(true); err != nil {
		return err
	}
	go w.run(ctx, interval)
	return nil
}
