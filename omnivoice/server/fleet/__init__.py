"""What a front end of several (`server.front_ends` > 1, omnivoice.server.front_ends) shares with the
others: its side of the supervisor's channel (member.py), the messages on it (messages.py), and what
it asks and answers (answers.py). The figures they count against together are server/tally.py's."""
