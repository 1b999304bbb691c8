//go:build tools

// Package deps pins the modules that the strategies and tests use until their code lands.
package deps

import (
	_ "github.com/alicebob/miniredis/v2"
	_ "github.com/dunglas/httpsfv"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/testutil"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/stretchr/testify/require"
	_ "go.uber.org/goleak"
	_ "gonum.org/v1/plot"
	_ "gonum.org/v1/plot/plotter"
	_ "gonum.org/v1/plot/plotutil"
	_ "gonum.org/v1/plot/vg"
)
