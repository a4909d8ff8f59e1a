"""The store stage: document back ends (SQLite, MongoDB), group commit, item documents."""
