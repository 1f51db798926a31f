"""How ranks talk: message layouts, the one inbox, the long-haul link and its pacing, the checkpoint
cut, who talks to whom."""
