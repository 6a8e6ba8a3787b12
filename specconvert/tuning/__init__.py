"""`specconvert tune`: measure acceptance and step costs, predict, check, choose a draft-length schedule."""
