package pgtest_test

import "github.com/jackc/pgx/v5"

var pgxConnect = pgx.ConnectConfig
