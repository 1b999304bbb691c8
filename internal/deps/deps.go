//go:build tools

// Package deps pins the modules that the strategies and tests use until their code lands.
package deps
import (
 _ "github.com/redis/go-redis/v9"
 _ "github.com/jackc/pgx/v5/pgxpool"
 _ "github.com/stretchr/testify/require"
 _ "github.com/alicebob/miniredis/v2"
 _ "go.uber.org/goleak"
 _ "github.com/dunglas/httpsfv"
)
