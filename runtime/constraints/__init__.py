"""What the output must follow: a grammar's state (`grammar`, llguidance behind it) and the masks it
puts on a round's rows (`guide`)."""
