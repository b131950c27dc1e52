package controlplane

import (
	"io"
	"log/slog"
	"time"
)

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// defaultTestTimeout bounds every wait of these tests.
const defaultTestTimeout = 10 * time.Second
